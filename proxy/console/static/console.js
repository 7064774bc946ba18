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
