// Enhancement only: every page reads the same without it. "/" jumps to the text search.
"use strict";
document.addEventListener("keydown", function (event) {
  var search = document.querySelector("input[name=q]");
  var typing = /^(INPUT|TEXTAREA|SELECT)$/.test(document.activeElement.tagName);
  if (event.key === "/" && search && !typing) {
    event.preventDefault();
    search.focus();
  }
});

// Live tail (the list's "Live" box, off by default): every two seconds the list's own API
// query is asked for its first page and rows not shown yet go on top. Recorded text is only
// ever set as textContent, never parsed as HTML.
(function () {
  var box = document.getElementById("live");
  if (!box) { return; }
  var table = document.querySelector("table.list");
  var body = table.querySelector("tbody");
  var timer = null;

  function cell(row, text, className) {
    var td = document.createElement("td");
    if (className) { td.className = className; }
    td.textContent = text === null || text === undefined ? "" : String(text);
    row.appendChild(td);
    return td;
  }

  function usd(value) {
    return value === null ? "" : "$" + String(parseFloat(Number(value).toPrecision(4)));
  }

  function ms(value) {
    return value === null ? "" : Math.round(value).toLocaleString("en-US") + " ms";
  }

  function row(item) {
    var tr = document.createElement("tr");
    tr.className = "new";
    tr.dataset.id = item.id;
    var when = cell(tr, "");
    var link = document.createElement("a");
    link.href = "/exchanges/" + encodeURIComponent(item.id);
    link.textContent = "just now";
    link.title = item.started_at;
    when.appendChild(link);
    cell(tr, item.path.replace(/^\/v\d+\//, ""), "endpoint");
    cell(tr, item.response_model || item.model, "model").title = item.response_model || item.model || "";
    cell(tr, item.outcome + " " + (item.status === null ? "" : item.status), "result");
    cell(tr, "", "preview");
    var tokens = item.prompt_tokens === null && item.completion_tokens === null ? "" :
      (item.prompt_tokens || 0) + " / " + (item.completion_tokens || 0);
    cell(tr, tokens, "num");
    cell(tr, usd(item.cost_usd), "num");
    cell(tr, ms(item.duration_ms), "num");
    cell(tr, ms(item.ttft_ms), "num");
    cell(tr, item.user, "user");
    cell(tr, item.key_name || item.key_hint, "key");
    cell(tr, Object.keys(item.tags).map(function (k) { return k + "=" + item.tags[k]; }).join(" "), "tags");
    return tr;
  }

  function poll() {
    var api = box.dataset.api;
    fetch(api + (api.indexOf("?") < 0 ? "?" : "&") + "limit=50", { credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.json() : { items: [] }; })
      .then(function (page) {
        var known = {};
        body.querySelectorAll("tr[data-id]").forEach(function (tr) { known[tr.dataset.id] = true; });
        var fresh = page.items.filter(function (item) { return !known[item.id]; });
        fresh.reverse().forEach(function (item) { body.insertBefore(row(item), body.firstChild); });
        if (fresh.length) { table.hidden = false; }
      })
      .catch(function () { /* the next tick tries again */ });
  }

  box.addEventListener("change", function () {
    if (box.checked) {
      poll();
      timer = setInterval(poll, 2000);
    } else {
      clearInterval(timer);
    }
  });
})();

// "Copy" buttons: the text of the element they name goes to the clipboard.
document.addEventListener("click", function (event) {
  var button = event.target.closest ? event.target.closest("button.copy") : null;
  if (!button || !navigator.clipboard) { return; }
  var source = document.getElementById(button.dataset.copy);
  navigator.clipboard.writeText(source ? source.textContent : "").then(function () {
    button.textContent = "Copied";
  });
});
