"""Alerts and budgets (SPEC section 13): rules read from the record, fired once in all.

The rules themselves are `proxy.alert_rules` (config checks them at load, below this layer);
the relay's budget check is `proxy.relay.budgets`.

- `measure`: what each rule reads from the database over its window or period.
- `state`: the state row per (alert, group), moved by compare-and-set so that one process of
  all those sharing the database delivers each crossing; the history the console shows.
- `deliver`: the log line and the webhook (retried in the background, never on traffic).
- `watch`: the background evaluation in `serve`; it keeps the relay's `Blocked` budgets.
- `prom`: the rules as Prometheus alerting rules (`flightrec alerts rules`).
"""
