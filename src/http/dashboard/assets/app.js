// jobhost dashboard: keeps each page's main part fresh without a reload,
// and asks before a form that changes many things is sent.
"use strict";

(function () {
  const main = document.getElementById("live");
  if (!main) return;
  const every = Number(main.dataset.live) || 2000;
  let busy = false;

  // A refresh would drop what the operator is typing or selecting.
  function interacting() {
    const active = document.activeElement;
    if (active && main.contains(active) && active.matches("input, select, textarea")) return true;
    const selection = window.getSelection();
    return selection && !selection.isCollapsed && main.contains(selection.anchorNode);
  }

  async function refresh() {
    if (busy || document.hidden || interacting()) return;
    busy = true;
    try {
      const response = await fetch(window.location.href, {
        headers: { "X-Jobhost-Live": "1" },
        credentials: "same-origin",
      });
      if (response.ok) {
        const html = await response.text();
        if (html !== main.innerHTML) {
          main.innerHTML = html;
          main.dataset.refreshed = String(Date.now());
        }
        document.body.classList.remove("stale");
      } else {
        document.body.classList.add("stale");
      }
    } catch (_) {
      document.body.classList.add("stale");
    } finally {
      busy = false;
    }
  }

  setInterval(refresh, every);
  document.addEventListener("visibilitychange", refresh);

  document.addEventListener("submit", function (event) {
    const question = event.target.dataset.confirm;
    if (question && !window.confirm(question)) event.preventDefault();
  });
})();
