// The console's one script (served from /static: the CSP allows no inline script).  It counts
// down each approval's expiry, and holds the decision buttons back until the operator is at
// the page; the page works the same without it.
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
// The double-click defence (docs/console.md, "Security model"): a page elsewhere can send this
// tab here on its first click and time its second to land on a button.  The decision buttons
// the server rendered enabled ([data-decide]) are disabled until the page has been visible for
// ARM_MS and the pointer has then moved over it; hidden again (another tab, a popup over it),
// they are disabled again and the wait starts over.
// A page the server rendered held (opened from another page) has its buttons disabled for
// good; its reload link ([data-reload], the way out) has no address until it is armed the same
// way -- else a click placed in advance would reload it enabled for the next one.
const ARM_MS = 1000;
function guard() {
  const buttons = [...document.querySelectorAll("button[data-decide]")].filter((b) => !b.disabled);
  const links = [...document.querySelectorAll("a[data-reload]")];
  let since = document.visibilityState === "visible" ? performance.now() : null;
  const hold = (on) => {
    for (const b of buttons) b.disabled = on;
    for (const a of links) {
      if (on) a.removeAttribute("href");
      else a.href = a.dataset.reload;
    }
  };
  hold(true);
  document.addEventListener("visibilitychange", () => {
    since = document.visibilityState === "visible" ? performance.now() : null;
    hold(true);
  });
  // A move counts only once the page has been visible ARM_MS, and only a real one (the user
  // agent's, a distance moved): the browser's own move event when a page loads or lays out
  // under a still pointer (the attack's) arms nothing.
  document.addEventListener("pointermove", (e) => {
    const moved = e.isTrusted && (e.movementX !== 0 || e.movementY !== 0);
    if (moved && since !== null && performance.now() - since >= ARM_MS) hold(false);
  });
}
document.addEventListener("DOMContentLoaded", () => { guard(); tick(); setInterval(tick, 1000); });
