"""Pure parsing, no I/O: stream events, reassembly, WebSocket sessions."""
