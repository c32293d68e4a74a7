// The review panel of `evalloop view` (never in the static report.html). It posts a person's
// verdict to the server that served the page; every string is set with textContent, so run
// text and earlier reviews show literally and nothing in them can execute.
window.evalloopReviewPanel = function (box, c) {
  "use strict";
  var api = document.body.dataset.reviewApi;
  if (!api) { return; }
  function el(name, text, cls) {
    var node = document.createElement(name);
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    if (cls) { node.className = cls; }
    return node;
  }
  var sample = c.sample === undefined ? null : c.sample;
  var panel = el("div", null, "review-panel");
  panel.id = "review-panel";
  panel.appendChild(el("h3", "Review"));
  panel.appendChild(el("p", "judge: " + (c.judge_verdict || c.verdict || "(no verdict)") +
    (c.settled_by ? " (settled by " + c.settled_by + ": " + c.verdict + ")" : ""), "note"));
  panel.appendChild(el("pre", c.why || "(the judge gave no why)"));
  var list = el("ul"); list.id = "review-list"; panel.appendChild(list);
  var chosen = null;
  var buttons = el("div"); buttons.id = "review-buttons";
  [["match", "match"], ["no_match", "no_match"], ["near_match", "near_match"],
   ["golden_wrong", "golden is wrong"]].forEach(function (b) {
    var btn = el("button", b[1]); btn.type = "button"; btn.dataset.verdict = b[0];
    btn.addEventListener("click", function () {
      chosen = b[0];
      buttons.querySelectorAll("button").forEach(function (x) {
        x.classList.toggle("chosen", x === btn);
        x.setAttribute("aria-pressed", x === btn ? "true" : "false");
      });
    });
    buttons.appendChild(btn);
  });
  panel.appendChild(buttons);
  var why = el("textarea"); why.id = "review-why"; why.required = true;
  why.placeholder = "why (required): what the judge got right or missed";
  panel.appendChild(why);
  var who = el("input"); who.id = "review-by"; who.value = document.body.dataset.reviewReviewer || "";
  who.placeholder = "reviewer"; panel.appendChild(who);
  var send = el("button", "record review"); send.type = "button"; send.id = "review-send";
  panel.appendChild(send);
  var status = el("p", "", "note"); status.id = "review-status"; panel.appendChild(status);
  function refresh() {
    return fetch(api).then(function (r) { return r.json(); }).then(function (all) {
      while (list.firstChild) { list.removeChild(list.firstChild); }
      all.filter(function (e) { return e.qid === c.qid && e.sample === sample; })
        .forEach(function (e) {
          list.appendChild(el("li", (e.golden_wrong ? "golden is wrong" : e.verdict) + " by " +
            e.reviewer + " at " + e.at + ": " + e.why, "review"));
        });
    });
  }
  send.addEventListener("click", function () {
    if (!chosen) { status.textContent = "choose a verdict first"; return; }
    if (!why.value.trim()) { status.textContent = "a review needs a why"; return; }
    status.textContent = "recording…";
    fetch(api, {
      method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify({qid: c.qid, sample: sample, verdict: chosen, why: why.value,
        reviewer: who.value})
    }).then(function (r) { return r.json().then(function (j) { return [r.ok, j]; }); })
      .then(function (res) {
        status.textContent = res[0] ? "recorded: " + res[1].message : "refused: " + res[1].error;
        status.dataset.done = res[0] ? "ok" : "refused";
        return refresh();
      });
  });
  box.appendChild(panel);
  refresh().then(function () { panel.dataset.ready = "1"; });
};
