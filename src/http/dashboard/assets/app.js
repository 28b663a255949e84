// jobhost dashboard: keeps each page's main part fresh without a reload,
// and asks before a form that changes many things is sent.
"use strict";

(function () {
  const main = document.getElementById("live");
  // Pages without data-live (signing in, a problem) stay as they are.
  if (!main || !main.dataset.live) return;
  const every = Number(main.dataset.live) || 2000;
  let busy = false;
  // The last markup the server sent: the page is replaced only when it changes.
  let last = null;

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
        cache: "no-store",
      });
      if (response.ok) {
        const html = await response.text();
        if (html !== last) {
          last = html;
          // Folded or unfolded sections stay as the operator left them.
          const folds = Array.from(main.querySelectorAll("details"), (d) => d.open);
          main.innerHTML = html;
          main.querySelectorAll("details").forEach((d, i) => {
            if (i < folds.length) d.open = folds[i];
          });
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

  // On a phone the filter form folds away unless a filter is set.
  const filters = document.querySelector("details.filters");
  if (filters && window.innerWidth < 640 && !/[?&](state|job|queue|key|batch|since|until)=./.test(location.search)) {
    filters.open = false;
  }

  setInterval(refresh, every);
  document.addEventListener("visibilitychange", refresh);

  // A chart's point (or deploy mark) shows its values in the chart's
  // readout, on hover with a mouse or on a tap; the page's markup holds
  // them in each hit area's title, so a refreshed chart needs nothing new.
  function show(event) {
    const hit = event.target.closest && event.target.closest(".chart rect.hit");
    if (!hit) return;
    const chart = hit.closest(".chart");
    chart.querySelectorAll("rect.hit.on").forEach((r) => r.classList.remove("on"));
    hit.classList.add("on");
    const title = hit.querySelector("title");
    chart.querySelector(".readout").textContent = title ? title.textContent : "";
  }
  document.addEventListener("mouseover", show);
  document.addEventListener("click", show);

  document.addEventListener("submit", function (event) {
    const question = event.target.dataset.confirm;
    if (question && !window.confirm(question)) event.preventDefault();
  });
})();
