// The console's one script (served from /static: the CSP allows no inline script).  It only
// counts down each approval's expiry; the page works the same without it.
"use strict";
// From the seconds left the server computed by the journal's clock (the database's on a shared
// journal), never the browser's clock against an expiry recorded in another clock's time.
const loaded = performance.now();
function tick() {
  const gone = (performance.now() - loaded) / 1000;
  for (const el of document.querySelectorAll("[data-left]")) {
    const left = Math.floor(Number(el.dataset.left) - gone);
    if (left <= 0) { el.textContent = "expired"; continue; }
    const m = Math.floor(left / 60), s = left % 60;
    el.textContent = "expires in " + (m ? m + " min " : "") + s + " s";
  }
}
document.addEventListener("DOMContentLoaded", () => { tick(); setInterval(tick, 1000); });
