// The report's filters and per-case drill-down. Inlined into report.html; no network.
// Every string from the run is set with textContent (never innerHTML), so run text shows
// literally and nothing in it can execute.
// The case data is base64 of gzipped JSON (report_html.embedded_data); the browser's own
// DecompressionStream inflates it, in memory.
function loadCases() {
  "use strict";
  var packed = atob(document.getElementById("case-data").textContent.trim());
  var bytes = new Uint8Array(packed.length);
  for (var i = 0; i < packed.length; i++) { bytes[i] = packed.charCodeAt(i); }
  var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return new Response(stream).text().then(JSON.parse);
}

loadCases().then(function (cases) {
  "use strict";
  var table = document.getElementById("cases");
  if (!table) { return; }
  var rows = table.tBodies[0].rows;
  var outcome = document.getElementById("f-outcome");
  var tag = document.getElementById("f-tag");
  var split = document.getElementById("f-split");
  var search = document.getElementById("f-search");
  var shown = document.getElementById("f-shown");
  var haystack = cases.map(function (c) {
    return [c.key, c.question, c.answer, c.why, c.final_query, c.reason]
      .filter(Boolean).join("\n").toLowerCase();
  });

  function applyFilters() {
    var o = outcome.value, t = tag.value, s = split.value, q = search.value.trim().toLowerCase();
    var n = 0;
    for (var i = 0; i < rows.length; i++) {
      var c = cases[i];
      var ok = (!o || c.outcome === o) && (!s || c.split === s) &&
        (!t || (c.tags || []).indexOf(t) >= 0) && (!q || haystack[i].indexOf(q) >= 0);
      rows[i].hidden = !ok;
      if (ok) { n++; }
    }
    shown.textContent = n + " of " + rows.length + " attempts shown";
  }
  [outcome, tag, split].forEach(function (el) { el.addEventListener("change", applyFilters); });
  search.addEventListener("input", applyFilters);

  function el(name, text, cls) {
    var node = document.createElement(name);
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    if (cls) { node.className = cls; }
    return node;
  }
  // Shares print as 0.33, never 0.3333333333333333.
  function two(v) { return typeof v === "number" && !Number.isInteger(v) ? v.toFixed(2) : v; }
  var FOLD = 1200;
  // A JSON tool result reads indented; past FOLD characters it is folded behind its size.
  function result(parent, text) {
    var shown = text;
    try {
      var parsed = JSON.parse(text);
      if (parsed !== null && typeof parsed === "object") { shown = JSON.stringify(parsed, null, 2); }
    } catch (e) { shown = text; }
    if (shown === null || shown === undefined || String(shown).length <= FOLD) { pre(parent, shown); return; }
    var d = el("details", null, "fold");
    d.appendChild(el("summary", "tool result (" + String(shown).length + " characters)"));
    pre(d, shown);
    parent.appendChild(d);
  }
  function section(parent, title) { parent.appendChild(el("h3", title)); }
  function pre(parent, text) { parent.appendChild(el("pre", text === null || text === undefined ? "(none)" : text)); }
  function kv(parent, pairs) {
    var dl = el("dl", null, "kv");
    pairs.forEach(function (p) {
      if (p[1] === null || p[1] === undefined || p[1] === "") { return; }
      dl.appendChild(el("dt", p[0]));
      dl.appendChild(el("dd", p[1]));
    });
    parent.appendChild(dl);
  }
  function grid(parent, head, body) {
    var t = el("table"), tr = el("tr");
    head.forEach(function (h) { tr.appendChild(el("th", h)); });
    var thead = el("thead"); thead.appendChild(tr); t.appendChild(thead);
    var tb = el("tbody");
    body.forEach(function (r) {
      var row = el("tr");
      r.forEach(function (v) { row.appendChild(el("td", v)); });
      tb.appendChild(row);
    });
    t.appendChild(tb);
    parent.appendChild(t);
    return t;
  }

  function drill(i) {
    var c = cases[i];
    var box = document.getElementById("drill");
    while (box.firstChild) { box.removeChild(box.firstChild); }
    box.hidden = false;
    for (var r = 0; r < rows.length; r++) { rows[r].classList.toggle("open", r === i); }
    var h = el("h2", c.key + " "); h.appendChild(el("span", c.outcome, "pill o-" + c.outcome));
    box.appendChild(h);
    kv(box, [["split", c.split], ["tags", (c.tags || []).join(", ")], ["coverage", c.coverage],
      ["verdict", c.verdict], ["settled by", c.settled_by], ["judge said", c.judge_verdict],
      ["people disagree", c.people_disagree],
      ["confidence", c.confidence], ["reason", c.reason],
      ["gold_status", c.gold_status], ["gold_note", c.gold_note], ["harness error", c.error]]);
    section(box, "Question"); pre(box, c.question);
    section(box, "Golden");
    if (c.golden) {
      kv(box, [["status", c.golden.status], ["kind", c.golden.kind], ["path", c.golden.path],
        ["rubric", c.golden.rubric], ["mustState", (c.golden.mustState || []).join(" | ")]]);
      if (c.golden.value !== null) { pre(box, c.golden.value); }
    } else { box.appendChild(el("p", "no golden (the case is not in this set's cases.jsonl)", "note")); }
    section(box, "Final query" + (c.final_query_source ? " (" + c.final_query_source + ")" : ""));
    pre(box, c.final_query);
    section(box, "Prediction rows");
    if (c.columns && c.columns.length) { grid(box, c.columns, c.rows).id = "drill-rows"; }
    else { box.appendChild(el("p", "no rows", "note")); }
    if (c.rows_note) { box.appendChild(el("p", c.rows_note, "note")); }
    section(box, "Answer"); pre(box, c.answer);
    section(box, "Judge's why"); pre(box, c.why);
    // Served by `evalloop view` only: the review panel (review.js); the static file has none.
    if (window.evalloopReviewPanel) { window.evalloopReviewPanel(box, c); }
    section(box, "Retrieval");
    kv(box, [["recall", two(c.recall)], ["precision", two(c.precision)]]);
    if (c.entities && c.entities.length) {
      grid(box, ["expected entity", "route (delivery)", "rank", "anyOf group"], c.entities.map(function (e) {
        return [e.id, e.delivery, e.rank === null || e.rank === undefined ? "" : e.rank,
          e.group === null || e.group === undefined ? "" : e.group];
      })).id = "drill-entities";
    }
    if (c.diagnosis) {
      section(box, "Diagnosis");
      var dg = c.diagnosis;
      kv(box, [["status", dg.status], ["component", dg.component], ["primary code", dg.primary_code],
        ["contributing", dg.contributing_codes], ["owner", dg.owner], ["sufficiency", dg.sufficiency],
        ["failure shape", dg.shapes]]);
      pre(box, dg.diagnosis || dg.reason);
    }
    if (c.contamination && c.contamination.length) {
      section(box, "Contamination");
      var ul = el("ul");
      c.contamination.forEach(function (why) { ul.appendChild(el("li", why)); });
      box.appendChild(ul);
    }
    section(box, "Transcript");
    if (c.transcript_note) { box.appendChild(el("p", c.transcript_note, "note")); }
    (c.transcript || []).forEach(function (s) {
      var d = el("div", null, "step step-" + s.kind);
      d.appendChild(el("strong", s.kind === "call" ? "tool call: " + s.role : (s.kind === "result" ? "tool result" : s.role)));
      if (s.kind === "result") { result(d, s.text); } else { d.appendChild(el("pre", s.text)); }
      box.appendChild(d);
    });
    box.scrollIntoView();
  }
  table.tBodies[0].addEventListener("click", function (ev) {
    var tr = ev.target.closest("tr");
    if (tr && tr.dataset.i !== undefined) { drill(Number(tr.dataset.i)); }
  });
  applyFilters();
  document.body.dataset.ready = "1";
});
