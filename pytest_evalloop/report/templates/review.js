// The review panel of `evalloop view` (never in the static report.html). It posts a person's
// verdict to the server that served the page, with the server's token (only its own pages
// hold it); every string is set with textContent, so run text and earlier reviews show
// literally and nothing in them can execute.
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
  if (c.not_reviewable) {
    // Nothing to settle: say why instead of offering a form that would be refused.
    var hidden = el("p", "This attempt cannot be reviewed: " + c.not_reviewable, "note");
    hidden.id = "review-hidden";
    panel.appendChild(hidden);
    box.appendChild(panel);
    panel.dataset.ready = "1";
    return;
  }
  var said = el("p", "", "note"); said.id = "review-judge"; panel.appendChild(said);
  // What the judge said stays what it said, whatever people rule after.
  var judgeSaid = c.judge_verdict || c.verdict || "(no verdict)";
  function describe() {
    said.textContent = "judge: " + judgeSaid +
      (c.settled_by ? " (settled by " + c.settled_by + ": " + c.verdict + ")" : "") +
      (c.people_disagree ? " (people disagree: " + c.people_disagree +
        "; one more review settles it)" : "");
  }
  describe();
  panel.appendChild(el("pre", c.why || "(the judge gave no why)"));
  var list = el("ul"); list.id = "review-list"; panel.appendChild(list);
  var chosen = null;
  var buttons = el("div"); buttons.id = "review-buttons";
  function choose(btn) {
    chosen = btn ? btn.dataset.verdict : null;
    buttons.querySelectorAll("button").forEach(function (x) {
      x.classList.toggle("chosen", x === btn);
      x.setAttribute("aria-pressed", x === btn ? "true" : "false");
    });
  }
  [["match", "match"], ["no_match", "no_match"], ["near_match", "near_match"],
   ["golden_wrong", "golden is wrong"]].forEach(function (b) {
    var btn = el("button", b[1]); btn.type = "button"; btn.dataset.verdict = b[0];
    btn.addEventListener("click", function () { choose(btn); });
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
  // The attempt's badges (its row in the table, the drill-down's heading) follow the count.
  function badge(j) {
    c.outcome = j.outcome; c.settled_by = j.settled_by; c.people_disagree = j.people_disagree;
    if (j.settled_by) { c.verdict = j.outcome; }
    document.querySelectorAll("#cases tbody tr").forEach(function (tr) {
      if (tr.dataset.key !== c.key) { return; }
      tr.dataset.outcome = j.outcome;
      var pill = tr.querySelector(".pill");
      pill.textContent = j.outcome; pill.className = "pill o-" + j.outcome;
      var mark = tr.querySelector(".people-disagree");
      if (j.people_disagree && !mark) {
        pill.parentNode.appendChild(el("span", "people disagree", "pill people-disagree"));
      } else if (!j.people_disagree && mark) { mark.remove(); }
    });
    var head = box.querySelector("h2 .pill");
    if (head) { head.textContent = j.outcome; head.className = "pill o-" + j.outcome; }
    describe();
  }
  send.addEventListener("click", function () {
    if (!chosen) { status.textContent = "choose a verdict first"; return; }
    if (!why.value.trim()) { status.textContent = "a review needs a why"; return; }
    status.textContent = "recording…";
    delete status.dataset.done;
    send.disabled = true;
    fetch(api, {
      method: "POST",
      headers: {"Content-Type": "application/json",
        "X-Evalloop-Token": document.body.dataset.reviewToken || ""},
      body: JSON.stringify({qid: c.qid, sample: sample, verdict: chosen, why: why.value,
        reviewer: who.value})
    }).then(function (r) { return r.json().then(function (j) { return [r.ok, j]; }); })
      .then(function (res) {
        send.disabled = false;
        if (res[0]) {
          // Recorded: the form is cleared (no double submit) and the badge follows.
          choose(null); why.value = "";
          badge(res[1]);
        }
        status.textContent = res[0] ? "recorded: " + res[1].message : "refused: " + res[1].error;
        return refresh().then(function () {
          status.dataset.done = res[0] ? "ok" : "refused";
        });
      });
  });
  box.appendChild(panel);
  refresh().then(function () { panel.dataset.ready = "1"; });
};
