// The console's one script (served from /static: the CSP allows no inline script).  It only
// counts down each approval's expiry; the page works the same without it.
"use strict";
function tick() {
  const now = Date.now() / 1000;
  for (const el of document.querySelectorAll("[data-expires]")) {
    const left = Math.floor(Number(el.dataset.expires) - now);
    if (left <= 0) { el.textContent = "expired"; continue; }
    const m = Math.floor(left / 60), s = left % 60;
    el.textContent = "expires in " + (m ? m + " min " : "") + s + " s";
  }
}
document.addEventListener("DOMContentLoaded", () => { tick(); setInterval(tick, 1000); });
