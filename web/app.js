// web/app.js — the page's logic. The form is generated from GET /v1/fields,
// the request field table that also drives the CLI's flags and the Python
// keyword arguments: one control per field, grouped by the table's groups,
// shown only for the chosen command and mode. Only fields changed from their
// defaults are sent, and mirrored into the URL (?batch=2&seq=1024), so a link
// reproduces the request. Results: the breakdown bar (fixed colour per
// component, capacity line), the timeline SVG that the CLI's --timeline
// FILE.svg writes (rendered by the service), the advisor's remedies as
// commands to paste, and a snapshot drop zone.
"use strict";
(() => {
  const $ = (s, root = document) => root.querySelector(s);
  const $$ = (s, root = document) => [...root.querySelectorAll(s)];

  // A DOM builder: text children are text nodes (never parsed as HTML).
  function h(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const k of kids.flat(Infinity)) if (k !== null && k !== undefined && k !== false) e.append(k instanceof Node ? k : String(k));
    return e;
  }

  const FORM_COMMANDS = ["estimate", "fit", "advise", "plan", "sweep"];
  const RUN_LABEL = { estimate: "Estimate", fit: "Find limits", advise: "Advise", plan: "Plan", sweep: "Sweep" };
  const TITLE = { estimate: "Estimate", fit: "Largest batch and sequence", advise: "Advisor", plan: "Parallel layouts", sweep: "Sweep" };
  const OPEN_GROUPS = new Set(["model", "job", "gpu"]);
  const PREFERRED_MODEL = "llama-3.2-1b";

  // One colour per breakdown row key, the same in every answer, bar and legend.
  const COLORS = {
    weights: "#3563e9", adapter_weights: "#8fa8f8", master_weights: "#1e3a8a", gradients: "#10b981",
    optimizer_states: "#f59e0b", optimizer_temporaries: "#fcd34d", activations: "#ef4444", activation_gradients: "#f97316",
    autocast_weight_casts: "#ec4899", lora_activations: "#f9a8d4", kv_cache: "#8b5cf6", gathered_params: "#06b6d4",
    comm_buffers: "#0e7490", transient: "#b45309", cublas_workspace: "#84cc16", allocator_rounding: "#d4d4d8",
    allocator_overhead: "#94a3b8", cuda_context: "#475569", nccl: "#14b8a6", unattributed: "#a8a29e",
  };
  // A key not in the map (a future row) gets a colour from its name: stable too.
  function colorOf(key) {
    if (Object.prototype.hasOwnProperty.call(COLORS, key)) return COLORS[key];
    let x = 0;
    for (const c of String(key)) x = (x * 31 + c.charCodeAt(0)) >>> 0;
    return `hsl(${x % 360}, 55%, 50%)`;
  }

  function fmtBytes(b) {
    const u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let i = 0, v = Math.abs(Number(b) || 0);
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (b < 0 ? "-" : "") + v.toFixed(i ? 2 : 0) + " " + u[i];
  }
  const pctOf = (x, total) => (total ? (100 * x / total).toFixed(1) : "0") + "%";
  const num = (x) => Number(x).toLocaleString("en-US");

  // ---- the field table and the form ---------------------------------------
  let TABLE = null;          // GET /v1/fields
  const CTRL = new Map();    // field name -> {f, input, row, def, group}
  const GROUPS = new Map();  // group name -> <details>
  let CONFIG = null, CONFIG_NAME = "";

  // A field is on the page when the service reads it from a form: not a file
  // (path), not an inline object (config.json has its own picker), not an
  // output of the command line (cli_only; format: the service answers JSON).
  // Two commands may give one name different rows (`quant`: a job's weight
  // quantization, serving's GGUF type); the page has one control per name,
  // the first row's.
  function onPage(f) {
    return f.type !== "path" && f.type !== "object" && !f.cli_only && f.name !== "format" &&
      (f.commands || []).some((c) => FORM_COMMANDS.includes(c)) &&
      (!TABLE || TABLE.fields.find((g) => g.name === f.name) === f);
  }
  const applies = (f, cmd, mode) => (f.commands || []).includes(cmd) && (!f.modes || f.modes.includes(mode));
  const command = () => $("#command").value;
  const currentMode = () => { const c = CTRL.get("mode"); return c ? value(c) || "train" : "train"; };

  function percentText(x) { return +(Number(x) * 100).toFixed(6) + "%"; }
  function parsePercent(v) {
    const s = String(v).trim();
    const n = s.endsWith("%") ? Number(s.slice(0, -1)) / 100 : Number(s);
    return s !== "" && Number.isFinite(n) ? n : NaN;
  }

  // The control's text for the field's default ("" when the service computes it).
  function defaultValue(f) {
    if (f.type === "bool") return f.default === true ? "true" : "false";
    if (f.default === null || f.default === undefined) return "";
    if (f.default_text) return "";  // 0 standing for "computed" (nodes, gpus-per-node)
    if (f.type === "percent") return percentText(f.default);
    if (Array.isArray(f.default)) return f.default.join(",");
    return String(f.default);
  }

  // An example for text inputs: the help's "e.g. X", else one per type.
  function example(f) {
    const m = /e\.g\.\s+([^\s;)]+?)[,.]?(?:\s|$|\))/.exec(f.help || "");
    if (m) return m[1];
    switch (f.type) {
      case "size": return "24GiB";
      case "percent": return "5%";
      case "count": return "7B";
      case "int-list": return "1,2,4";
      case "enum-list": return (f.values || []).slice(0, 2).join(",");
      case "string-list": return "q_proj,v_proj";
      default: return "";
    }
  }

  function tooltip(f) {
    let t = f.help || "";
    if (f.values && f.values.length) t += `\nchoices: ${f.values.join(", ")}`;
    if (f.unit) t += `\nunit: ${f.unit}`;
    if (f.default_text) t += `\ndefault: ${f.default_text}`;
    else if (f.default !== null && f.default !== undefined && f.default !== "") t += `\ndefault: ${f.type === "percent" ? percentText(f.default) : f.default}`;
    if (f.min !== null && f.min !== undefined) t += `\nmin: ${f.min}`;
    if (f.max !== null && f.max !== undefined) t += `\nmax: ${f.max}`;
    return t + `\nCLI: --${f.name}`;
  }

  function hintText(f) {
    let t = f.help || "";
    if (f.default_text) t += ` (default: ${f.default_text})`;
    return t;
  }

  function buildControl(f, models, gpus) {
    const id = "f-" + f.name;
    let input;
    if (f.name === "model") {
      input = h("select", {}, h("option", { value: "" }, "— none (params, or config.json below) —"),
        models.map((m) => h("option", { value: m.name }, `${m.name} (${m.model_type})`)));
    } else if (f.name === "gpu") {
      const names = gpus.map((g) => g.name);
      input = h("select", {}, gpus.map((g) => h("option", { value: g.name }, `${g.name} (${+(g.memory / 2 ** 30).toFixed(1)} GiB)`)),
        f.default && !names.includes(f.default) ? h("option", { value: f.default }, f.default) : null);
    } else if (f.type === "enum") {
      input = h("select", {}, f.default === null || f.default === undefined ? h("option", { value: "" }, `default (${f.default_text || "auto"})`) : null,
        (f.values || []).map((v) => h("option", { value: v }, v)));
    } else if (f.type === "bool") {
      input = h("input", { type: "checkbox" });
    } else if (f.type === "int" || f.type === "number") {
      input = h("input", { type: "number", inputmode: f.type === "int" ? "numeric" : "decimal", step: f.type === "int" ? "1" : "any",
        min: f.min ?? null, max: f.max ?? null, placeholder: f.default_text ? "auto" : null });
    } else {
      const ex = example(f);
      input = h("input", { type: "text", spellcheck: "false", placeholder: ex ? `e.g. ${ex}` : (f.default_text ? "auto" : null) });
    }
    Object.assign(input, { id, name: f.name, title: tooltip(f) });
    input.dataset.field = f.name;
    input.dataset.type = f.type;
    input.setAttribute("aria-describedby", id + "-hint");
    const def = f.name === "model" ? "" : defaultValue(f);
    const c = { f, input, def, row: null };
    setValue(c, def);
    const label = h("label", { for: id, title: tooltip(f) }, f.name, f.unit ? h("span", { class: "unit" }, f.unit) : null);
    c.row = h("div", { class: "field" + (f.type === "bool" ? " bool" : ""), "data-field": f.name, "data-type": f.type },
      label, input, h("small", { class: "hint", id: id + "-hint" }, hintText(f)));
    return c;
  }

  function value(c) {
    return c.input.type === "checkbox" ? (c.input.checked ? "true" : "false") : c.input.value.trim();
  }
  function setValue(c, v) {
    if (c.input.type === "checkbox") c.input.checked = v === true || v === "true" || v === "1";
    else {
      if (c.input.tagName === "SELECT" && v !== "" && ![...c.input.options].some((o) => o.value === v)) c.input.append(h("option", { value: v }, v));
      c.input.value = v;
    }
  }

  // Changed from the default: what the request sends (a blank box is the default).
  function changed(c) {
    const v = value(c), d = c.def, t = c.f.type;
    if (v === d || v === "") return false;
    if ((t === "int" || t === "number") && d !== "" && Number(v) === Number(d)) return false;
    if (t === "percent" && d !== "" && parsePercent(v) === parsePercent(d)) return false;
    return true;
  }

  // The JSON value of a control (a string the service cannot read goes as
  // typed, so the answer is the service's own message, as the CLI gives it).
  function jsonValue(f, v) {
    switch (f.type) {
      case "bool": return v === "true";
      case "int": case "number": { const n = Number(v); return /^-?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$/i.test(v) && Number.isFinite(n) ? n : v; }
      case "size": case "count": return /^\d+$/.test(v) ? Number(v) : v;
      case "percent": return /^-?(\d+\.?\d*|\.\d+)$/.test(v) ? Number(v) : v;
      default: return v;
    }
  }

  // The request body of a command: the changed fields that apply to it.
  function requestBody(cmd) {
    const mode = currentMode(), b = {};
    for (const c of CTRL.values()) if (applies(c.f, cmd, mode) && changed(c)) b[c.f.key] = jsonValue(c.f, value(c));
    if (CONFIG && (cmd === "estimate" || cmd === "timeline")) { delete b.model; b.config = CONFIG; }
    return b;
  }

  function buildForm(table, models, gpus) {
    TABLE = table;
    const box = $("#fields");
    box.replaceChildren();
    for (const g of table.groups) {
      const fs = h("fieldset", {}, h("legend", {}, g.title));
      const det = h("details", { class: "group", "data-group": g.name, open: OPEN_GROUPS.has(g.name) }, h("summary", {}, g.title), fs);
      GROUPS.set(g.name, det);
    }
    for (const f of table.fields) {
      if (!onPage(f)) continue;
      if (!GROUPS.has(f.group)) GROUPS.set(f.group, h("details", { class: "group", "data-group": f.group }, h("summary", {}, f.group), h("fieldset", {})));
      const c = buildControl(f, models, gpus);
      c.group = f.group;
      CTRL.set(f.name, c);
      $("fieldset", GROUPS.get(f.group)).append(c.row);
      if (f.name === "model") c.row.after($("#config-row"));
    }
    for (const det of GROUPS.values()) if ($("fieldset", det).querySelector(".field")) box.append(det);
    const m = CTRL.get("model");
    if (m && models.some((x) => x.name === PREFERRED_MODEL)) setValue(m, PREFERRED_MODEL);
    else if (m && models.length) setValue(m, models[0].name);
  }

  function updateVisibility() {
    const cmd = command(), mode = currentMode();
    for (const c of CTRL.values()) c.row.hidden = !applies(c.f, cmd, mode);
    $("#config-row").hidden = cmd !== "estimate";
    for (const det of GROUPS.values()) det.hidden = !$$(".field", det).some((r) => !r.hidden);
    $("#timeline-card").hidden = cmd !== "estimate";
    $("#advise-card").hidden = cmd !== "estimate";
    $("#run").textContent = RUN_LABEL[cmd] || cmd;
    markChanged();
  }

  function markChanged() {
    let n = 0;
    for (const c of CTRL.values()) {
      const on = changed(c);
      c.row.classList.toggle("changed", on);
      if (on && !c.row.hidden) n++;
    }
    $("#changed-note").textContent = n ? `${n} field${n > 1 ? "s" : ""} changed` : "";
  }

  function syncUrl() {
    const q = new URLSearchParams();
    if (command() !== "estimate") q.set("command", command());
    for (const c of CTRL.values()) if (!c.row.hidden && changed(c)) q.set(c.f.name, value(c));
    const s = q.toString();
    history.replaceState(null, "", location.pathname + (s ? "?" + s : ""));
  }

  // Restores the form from the URL; true when it names any field (run it).
  function restoreFromUrl() {
    const q = new URLSearchParams(location.search);
    let any = false;
    const cmd = q.get("command");
    if (cmd && FORM_COMMANDS.includes(cmd)) $("#command").value = cmd;
    for (const [k, v] of q) {
      const c = CTRL.get(k) || [...CTRL.values()].find((x) => x.f.key === k);
      if (!c) continue;
      setValue(c, v);
      any = true;
    }
    return any;
  }

  function resetForm() {
    for (const c of CTRL.values()) setValue(c, c.def);
    const m = CTRL.get("model");
    if (m && [...m.input.options].some((o) => o.value === PREFERRED_MODEL)) setValue(m, PREFERRED_MODEL);
    clearConfig();
    updateVisibility();
    syncUrl();
  }

  // ---- talking to the service ------------------------------------------------
  async function readAnswer(r) {
    let d;
    try { d = await r.json(); } catch { throw new Error(`HTTP ${r.status}: the answer is not JSON`); }
    if (!r.ok || d.error) {
      const e = d.error || {};
      const err = new Error((e.message || `HTTP ${r.status}`) + (e.field ? ` (field: ${e.field})` : ""));
      err.field = e.field || "";
      throw err;
    }
    return d;
  }
  async function post(path, body, accept) {
    try {
      return await fetch(path, { method: "POST", headers: { "Content-Type": "application/json", Accept: accept || "application/json" }, body: JSON.stringify(body) });
    } catch (e) { throw new Error("network error: " + e.message); }
  }
  async function api(path, body) {
    if (body === undefined) {
      let r;
      try { r = await fetch(path); } catch (e) { throw new Error("network error: " + e.message); }
      return readAnswer(r);
    }
    return readAnswer(await post(path, body));
  }

  function showError(msg, field) {
    const e = $("#error");
    e.textContent = msg || "";
    e.classList.toggle("show", !!msg);
    for (const c of CTRL.values()) c.row.classList.remove("invalid");
    if (field) {
      const c = CTRL.get(field) || [...CTRL.values()].find((x) => x.f.key === field);
      if (c) {
        c.row.classList.add("invalid");
        const det = c.row.closest("details");
        if (det) det.open = true;
      }
    }
  }

  async function busy(btn, fn) {
    showError("");
    btn.disabled = true;
    try { await fn(); } catch (e) { showError(e.message, e.field); } finally { btn.disabled = false; }
  }

  // ---- results ----------------------------------------------------------------
  // The breakdown as a bar: scaled to the larger of the total and the capacity
  // (plus a margin), so the capacity line shows even when the job does not fit
  // (the bar then runs past it, the excess hatched).
  function breakdownBar(rows, total, cap) {
    const scale = Math.max(cap, total, 1) * 1.04;
    const at = (x) => (100 * x / scale).toFixed(3) + "%";
    const shown = rows.filter((r) => r.bytes > 0);
    const segs = h("div", { class: "segs", style: `width:${at(total)}` },
      shown.map((r) => h("div", { class: "seg", "data-key": r.key, style: `width:${(100 * r.bytes / (total || 1)).toFixed(4)}%;background:${colorOf(r.key)}`,
        title: `${r.label}: ${fmtBytes(r.bytes)}` })));
    const bar = h("div", { class: "bar", id: "bar", "data-total": total, "data-capacity": cap, "data-scale": scale }, segs);
    if (cap > 0) {
      if (total > cap) bar.append(h("div", { class: "over", style: `left:${at(cap)};width:${at(total - cap)}`, title: `over capacity by ${fmtBytes(total - cap)}` }));
      const right = cap / scale > 0.5;
      bar.append(h("div", { class: "cap-line", id: "cap-line", style: `left:${at(cap)}`, title: `GPU capacity ${fmtBytes(cap)}` },
        h("span", { class: "cap-label", style: right ? "right:4px" : "left:4px" }, `capacity ${fmtBytes(cap)}`)));
    }
    const legend = h("div", { class: "legend", id: "legend" }, shown.map((r) => h("span", { "data-key": r.key }, h("i", { style: `background:${colorOf(r.key)}` }), r.label)));
    return h("div", { class: "barbox" }, bar, legend);
  }

  function renderEstimate(d) {
    const p = d.per_gpu, cap = p.capacity || (d.gpu && d.gpu.memory) || 0, gpu = d.gpu ? d.gpu.name : "the GPU";
    const rows = d.breakdown || [];
    const time = d.time && d.time.step_seconds ? ` · step ${d.time.step_seconds.toFixed(3)} s` : "";
    const sim = d.simulation || {};
    return [
      h("div", { id: "verdict", class: p.fits ? "fits" : "nofit" }, p.fits ? `✓ Fits on ${gpu}` : `✗ Does not fit on ${gpu}`),
      h("div", { id: "total", "data-bytes": p.total_device, "data-capacity": cap },
        h("b", {}, fmtBytes(p.total_device)), ` of ${fmtBytes(cap)} per GPU (${pctOf(p.total_device, cap)}) · peak allocated ${fmtBytes(p.peak_allocated)} · reserved ${fmtBytes(p.peak_reserved)}${time}`),
      d.uncertainty && d.uncertainty.range ? h("div", { id: "range", "data-low": d.uncertainty.range.low, "data-high": d.uncertainty.range.high, title: d.uncertainty.basis },
        `range ${fmtBytes(d.uncertainty.range.low)} – ${fmtBytes(d.uncertainty.range.high)}: ${d.uncertainty.verdict}` +
        (d.uncertainty.calibrated ? " (calibrated)" : ` (path ${d.uncertainty.path})`)) : null,
      breakdownBar(rows, p.total_device, cap),
      h("div", { class: "scroll" }, h("table", { id: "breakdown" },
        h("thead", {}, h("tr", {}, h("th", {}, "Component"), h("th", { class: "n opt" }, "Bytes"), h("th", { class: "n" }, "GiB"), h("th", { class: "n" }, "Share"), h("th", { class: "opt" }, "Detail"))),
        h("tbody", {}, rows.map((r) => h("tr", { "data-key": r.key, title: r.detail || null },
          h("td", {}, h("span", { class: "swatch", style: `background:${colorOf(r.key)}` }), r.label),
          h("td", { class: "n opt" }, num(r.bytes)), h("td", { class: "n" }, (r.bytes / 2 ** 30).toFixed(2)), h("td", { class: "n" }, pctOf(r.bytes, p.total_device)),
          h("td", { class: "muted opt" }, r.detail || ""))),
        h("tr", {}, h("th", {}, "total per GPU"), h("th", { class: "n opt" }, num(p.total_device)), h("th", { class: "n" }, (p.total_device / 2 ** 30).toFixed(2)), h("th", {}), h("th", { class: "opt" }))))),
      sim.oom_detail ? h("p", { class: "note" }, sim.oom_detail) : null,
      (d.warnings || []).length ? h("ul", { class: "plain note", id: "warnings" }, d.warnings.map((w) => h("li", {}, w))) : null,
      (d.assumptions || []).length ? h("details", {}, h("summary", { class: "note" }, `${d.assumptions.length} assumptions`), h("ul", { class: "plain note" }, d.assumptions.map((a) => h("li", {}, a)))) : null,
    ];
  }

  function renderFit(d) {
    if (d.engine) {  // fit with a serving engine: what fits that engine
      const l = d.llamacpp;
      return [h("p", {}, `${d.model} served by ${d.engine} ${d.engine_version} on ${d.gpu}`), h("dl", { class: "kv", id: "fit-engine" },
        h("dt", {}, "longest request"), h("dd", { "data-fit-len": d.fit_max_model_len }, num(d.fit_max_model_len)),
        h("dt", {}, `requests of ${num(d.request_len)} tokens at once`), h("dd", {}, d.concurrency_at_request_len.toFixed(2)),
        h("dt", {}, "KV-cache tokens"), h("dd", {}, num(d.kv_cache_tokens)),
        l ? h("dt", {}, "most layers on the GPU") : null, l ? h("dd", {}, `${l.fit_gpu_layers} of ${l.n_layer + 1}`) : null),
        d.error ? h("p", { class: "note" }, d.error) : null];
    }
    const axis = (a, what) => a ? h("div", { class: "axis", "data-axis": a.axis },
      h("h3", {}, what), h("dl", { class: "kv" }, h("dt", {}, `largest ${a.axis}`), h("dd", { "data-largest": a.largest }, num(a.largest)),
        h("dt", {}, "memory there"), h("dd", {}, `${fmtBytes(a.total_device_at_largest)} of ${fmtBytes(a.capacity)}`),
        h("dt", {}, "limit"), h("dd", {}, a.limit || ""), h("dt", {}, "probes"), h("dd", {}, a.probes))) : null;
    return [h("p", {}, `${d.model ? d.model.name : ""} on ${d.gpu ? d.gpu.name : ""}`), axis(d.batch, "Micro-batch (at the chosen sequence)"), axis(d.seq, "Sequence (at the chosen batch)")];
  }

  function renderPlan(d) {
    const t = d.top || [];
    const out = [d.why ? h("p", {}, typeof d.why === "string" ? d.why : JSON.stringify(d.why)) : null];
    if (t.length) {
      out.push(h("div", { class: "scroll" }, h("table", { id: "plan-table" },
        h("thead", {}, h("tr", {}, ["#", "TP", "PP", "DP", "ZeRO/FSDP", "recompute", "batch × accum", "per GPU", "step s", "tok/s"].map((x, i) => h("th", { class: i && i !== 4 && i !== 5 ? "n" : null }, x)))),
        h("tbody", {}, t.map((r, i) => [
          h("tr", {}, h("td", {}, i + 1), h("td", { class: "n" }, r.tp), h("td", { class: "n" }, r.pp), h("td", { class: "n" }, r.dp),
            h("td", {}, r.fsdp && r.fsdp !== "none" ? `fsdp ${r.fsdp}` : `zero ${r.zero}`), h("td", {}, r.recompute), h("td", { class: "n" }, `${r.batch} × ${r.grad_accum}`),
            h("td", { class: "n" }, fmtBytes(r.per_gpu.total_device)), h("td", { class: "n" }, r.time ? r.time.step_seconds.toFixed(3) : ""),
            h("td", { class: "n" }, r.time ? num(Math.round(r.time.tokens_per_second)) : "")),
          r.command ? h("tr", {}, h("td", {}), h("td", { colspan: 9 }, cmdLine(r.command))) : null,
        ])))));
    }
    out.push(h("ul", { class: "plain note" }, (d.assumptions || []).map((a) => h("li", {}, a))));
    return out;
  }

  function renderSweep(d) {
    const pts = d.points || [], cap = d.capacity || 0;
    const scale = Math.max(cap, ...pts.map((p) => p.total_device), 1);
    return [h("div", { class: "scroll" }, h("table", { id: "sweep-table" },
      h("thead", {}, h("tr", {}, h("th", { class: "n" }, "batch"), h("th", { class: "n" }, "seq"), h("th", { class: "n" }, "per GPU"), h("th", {}, "fits"), h("th", {}, `breakdown (capacity ${fmtBytes(cap)})`))),
      h("tbody", {}, pts.map((p) => h("tr", {}, h("td", { class: "n" }, p.batch), h("td", { class: "n" }, p.seq), h("td", { class: "n" }, fmtBytes(p.total_device)),
        h("td", { class: p.fits ? "fits" : "nofit" }, p.fits ? "yes" : "no"),
        h("td", {}, h("div", { class: "minibar", style: `width:${(100 * Math.max(p.total_device, cap) / scale).toFixed(2)}%` },
          (p.breakdown || []).filter((r) => r.bytes > 0).map((r) => h("span", { "data-key": r.key, title: `${r.label}: ${fmtBytes(r.bytes)}`,
            style: `width:${(100 * r.bytes / Math.max(p.total_device, cap, 1)).toFixed(3)}%;background:${colorOf(r.key)}` }))))))))),
    d.fit ? h("p", { class: "note" }, typeof d.fit === "string" ? d.fit : JSON.stringify(d.fit)) : null];
  }

  // ---- commands to paste -----------------------------------------------------
  function shellQuote(s) {
    s = String(s);
    return /^[A-Za-z0-9_.,:=/+@%^-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`;
  }
  function numberOf(name, fallback) {
    const c = CTRL.get(name);
    if (!c) return fallback;
    const v = value(c) === "" ? c.f.default : value(c);
    const n = Number(v);
    return Number.isFinite(n) && n > 0 ? n : fallback;
  }
  // `gpumem estimate MODEL --flag value ...`: the form's changed fields, then
  // a remedy's flags. The advisor's flags are symbolic (B/2, 2G, N, 2N, >= 2):
  // they are resolved against the job, in order, as the advisor applies them.
  function estimateCommand(flags, gpus) {
    const mode = currentMode();
    const args = new Map();
    for (const c of CTRL.values()) {
      if (c.f.name === "model" || !applies(c.f, "estimate", mode) || !changed(c)) continue;
      args.set(c.f.name, c.f.type === "bool" ? value(c) === "true" : value(c));
    }
    const cur = { batch: numberOf("batch", 1), "grad-accum": numberOf("grad-accum", 1), gpus: numberOf("gpus", 1), tp: numberOf("tp", 1), pp: numberOf("pp", 1) };
    const toks = String(flags || "").trim().split(/\s+/).filter(Boolean);
    for (let i = 0; i < toks.length;) {
      const t = toks[i++];
      if (!t.startsWith("--")) continue;
      const name = t.slice(2), vals = [];
      while (i < toks.length && !toks[i].startsWith("--")) vals.push(toks[i++]);
      let v = vals.length ? vals.join(" ") : true, m;
      if (v === true) { /* a switch */ }
      else if ((m = /^(\d*)N$/.exec(v)) && name === "gpus") v = gpus || (Number(m[1]) || 1) * cur.gpus;
      else if ((m = /^B\/(\d+)$/.exec(v))) v = Math.max(1, Math.floor(cur.batch / Number(m[1])));
      else if ((m = /^(\d*)G$/.exec(v))) v = (Number(m[1]) || 1) * cur["grad-accum"];
      else if ((name === "tp" || name === "pp") && /^\d+$/.test(v)) v = Number(v) * cur[name];  // --tp 2: twice the current size
      else if ((m = /^>=\s*(\d+)$/.exec(v))) v = Math.max(cur[name] || 0, Number(m[1]), name === "grad-accum" ? 2 * cur.pp : 0);
      if (typeof v === "number" && name in cur) cur[name] = v;
      args.set(name, typeof v === "number" ? String(v) : v);
    }
    const model = CONFIG ? CONFIG_NAME || "config.json" : (CTRL.get("model") ? value(CTRL.get("model")) : "");
    const parts = ["gpumem", "estimate"];
    if (model) parts.push(shellQuote(model));
    for (const [k, v] of args) {
      if (v === true) parts.push(`--${k}`);
      else if (v === false) parts.push(`--no-${k}`);
      else parts.push(`--${k}`, shellQuote(v));
    }
    return parts.join(" ");
  }

  function cmdLine(text) {
    const code = h("code", { class: "cmd" }, text);
    const btn = h("button", { type: "button", class: "sec small", title: "copy the command" }, "copy");
    btn.addEventListener("click", async () => {
      try { await navigator.clipboard.writeText(text); btn.textContent = "copied"; }
      catch { const r = document.createRange(); r.selectNodeContents(code); const s = getSelection(); s.removeAllRanges(); s.addRange(r); btn.textContent = "selected"; }
      setTimeout(() => { btn.textContent = "copy"; }, 1500);
    });
    return h("div", { class: "cmdline" }, code, btn);
  }

  function renderAdvice(d) {
    const ts = d.techniques || [], ok = ts.filter((t) => t.applicable !== false), na = ts.filter((t) => t.applicable === false);
    const c = d.combination;
    const tag = (fits) => h("span", { class: "tag " + (fits ? "fits" : "nofit") }, fits ? "fits" : "does not fit");
    const time = (x) => `${x >= 0 ? "+" : ""}${(100 * x).toFixed(0)}% step time`;
    return [
      d.baseline ? h("p", {}, `Now ${fmtBytes(d.baseline.total_device)} of ${fmtBytes(d.capacity)} per GPU`, tag(d.baseline.fits)) : null,
      c && c.flags ? h("div", { class: "combination" }, h("b", {}, "Cheapest combination on the same GPUs: "),
        `${fmtBytes(c.total_device)}, ${time(c.time_cost)}`, tag(c.fits), cmdLine(c.command || estimateCommand(c.flags))) : null,
      h("ol", { class: "remedies" }, ok.map((t) => h("li", { class: "remedy", "data-key": t.key, "data-total": t.total_device, "data-gpus": t.gpus },
        h("b", {}, t.title), ` — saves ${fmtBytes(t.saving)} → ${fmtBytes(t.total_device)} per GPU${t.gpus > 1 ? ` on ${t.gpus} GPUs` : ""}, ${time(t.time_cost)}`, tag(t.fits),
        t.note ? h("div", { class: "note" }, t.note) : null,
        cmdLine(t.command || estimateCommand(t.flags, t.gpus))))),
      na.length ? h("details", {}, h("summary", { class: "note" }, `${na.length} not applicable`),
        h("ul", { class: "plain note" }, na.map((t) => h("li", {}, `${t.title}: ${t.why_not || "not applicable"}`)))) : null,
    ];
  }

  // ---- actions ------------------------------------------------------------------
  async function runCommand() {
    const cmd = command();
    syncUrl();
    const d = await api("/v1/" + cmd, requestBody(cmd));
    const body = $("#result-body");
    $("#result-title").textContent = TITLE[cmd] || cmd;
    const render = { estimate: renderEstimate, fit: renderFit, advise: renderAdvice, plan: renderPlan, sweep: renderSweep }[cmd];
    body.replaceChildren(...render(d).flat().filter(Boolean));
    body.dataset.command = cmd;
  }

  async function loadTimeline() {
    const r = await post("/v1/timeline?format=svg", requestBody("timeline"), "image/svg+xml");
    if (!r.ok || !(r.headers.get("Content-Type") || "").startsWith("image/svg+xml")) await readAnswer(r);  // throws the service's error
    const text = await r.text();
    const doc = new DOMParser().parseFromString(text, "image/svg+xml");
    if (doc.documentElement.nodeName !== "svg" || doc.querySelector("parsererror")) throw new Error("the timeline answer is not an SVG");
    const svg = document.importNode(doc.documentElement, true);
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", "memory timeline: allocated and reserved bytes over the allocator events of the simulated steps");
    const url = URL.createObjectURL(new Blob([text], { type: "image/svg+xml" }));
    $("#timeline").replaceChildren(svg, h("p", { class: "note" }, h("a", { href: url, download: "timeline.svg" }, "download the SVG"),
      " · the same plot as ", h("code", {}, "gpumem estimate --timeline FILE.svg")));
  }

  async function loadAdvice() {
    const d = await api("/v1/advise", requestBody("advise"));
    $("#advise").replaceChildren(...renderAdvice(d).filter(Boolean));
  }

  // ---- config.json upload -------------------------------------------------------
  function clearConfig() {
    CONFIG = null;
    CONFIG_NAME = "";
    $("#config-file").value = "";
    $("#config-note").textContent = "A Hugging Face config.json, read in the browser and sent with the request (estimate and timeline); the service reads no files.";
  }
  async function readConfig(file) {
    if (!file) { clearConfig(); return; }
    try {
      const j = JSON.parse(await file.text());
      if (!j || typeof j !== "object" || Array.isArray(j)) throw new Error("not a JSON object");
      CONFIG = j;
      CONFIG_NAME = file.name;
      $("#config-note").textContent = `using ${file.name} instead of the model (choose a model to go back)`;
      showError("");
    } catch (err) {
      clearConfig();
      showError(`${file.name}: not a config.json (${err.message})`);
    }
  }

  // ---- snapshot drop zone -------------------------------------------------------
  async function uploadSnapshot(file) {
    const zone = $("#dropzone");
    showError("");
    zone.classList.add("busy");
    try {
      let r;
      try { r = await fetch("/v1/snapshot", { method: "POST", headers: { "Content-Type": "application/octet-stream" }, body: file }); }
      catch (e) { throw new Error("network error: " + e.message); }
      renderSnapshot(await readAnswer(r), file.name);
    } catch (e) {
      showError(`${file.name}: ${e.message}`);
    } finally {
      zone.classList.remove("busy");
    }
  }

  function renderSnapshot(d, name) {
    const s = d.snapshot || {}, rep = d.replay || {};
    const tops = (d.top_allocations || []).slice(0, 10);
    $("#snapshot").replaceChildren(h("div", { id: "snapshot-summary", "data-peak-allocated": d.peak_allocated, "data-peak-reserved": d.peak_reserved },
      h("h3", {}, name),
      h("dl", { class: "kv" },
        h("dt", {}, "peak allocated"), h("dd", { id: "snap-peak-allocated" }, fmtBytes(d.peak_allocated), d.peak_source ? h("span", { class: "muted" }, ` (${d.peak_source})`) : null),
        h("dt", {}, "peak reserved"), h("dd", { id: "snap-peak-reserved" }, fmtBytes(d.peak_reserved)),
        h("dt", {}, "segments"), h("dd", { id: "snap-segments" }, `${s.segments ?? "?"} at the dump (${fmtBytes(s.reserved || 0)} reserved)` +
          (rep.segments_created !== undefined ? `; ${rep.segments_created} created in the replay` : "")),
        h("dt", {}, "allocated at the dump"), h("dd", {}, fmtBytes(s.allocated || 0)),
        h("dt", {}, "fragmentation"), h("dd", {}, `${fmtBytes(s.fragmentation || 0)}, largest free block ${fmtBytes(s.largest_free_block || 0)}`),
        (d.ooms || []).length ? [h("dt", {}, "out of memory"), h("dd", { class: "nofit" }, d.ooms.map((o) => `${fmtBytes(o.requested)} at ${o.frame || "?"}`).join("; "))] : null),
      tops.length ? [h("h4", {}, "Largest allocations"), h("div", { class: "scroll" }, h("table", { id: "snap-top" },
        h("thead", {}, h("tr", {}, h("th", { class: "n" }, "bytes"), h("th", {}, "where"))),
        h("tbody", {}, tops.map((t) => h("tr", {}, h("td", { class: "n" }, fmtBytes(t.bytes)), h("td", {}, t.frame || t.label || ""))))))] : null,
      (d.notes || []).length ? h("ul", { class: "plain note" }, d.notes.map((n) => h("li", {}, n))) : null));
  }

  function setupDropZone() {
    const zone = $("#dropzone"), input = $("#snapshot-file");
    const stop = (e) => { e.preventDefault(); e.stopPropagation(); };
    for (const ev of ["dragenter", "dragover"]) zone.addEventListener(ev, (e) => { stop(e); zone.classList.add("over"); });
    for (const ev of ["dragleave", "dragend"]) zone.addEventListener(ev, (e) => { stop(e); zone.classList.remove("over"); });
    zone.addEventListener("drop", (e) => {
      stop(e);
      zone.classList.remove("over");
      const f = e.dataTransfer && e.dataTransfer.files && e.dataTransfer.files[0];
      if (f) uploadSnapshot(f);
    });
    zone.addEventListener("click", (e) => { if (e.target === zone) input.click(); });
    zone.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); input.click(); } });
    input.addEventListener("change", () => { if (input.files[0]) uploadSnapshot(input.files[0]); input.value = ""; });
    // A file dropped elsewhere on the page must not replace the page.
    for (const ev of ["dragover", "drop"]) window.addEventListener(ev, (e) => { if (!zone.contains(e.target)) e.preventDefault(); });
  }

  // ---- start --------------------------------------------------------------------
  async function init() {
    setupDropZone();
    $("#config-file").addEventListener("change", (e) => readConfig(e.target.files[0]));
    $("#form").addEventListener("submit", (e) => { e.preventDefault(); busy($("#run"), runCommand); });
    $("#btn-timeline").addEventListener("click", (e) => busy(e.currentTarget, loadTimeline));
    $("#btn-advise").addEventListener("click", (e) => busy(e.currentTarget, loadAdvice));
    $("#reset").addEventListener("click", resetForm);
    $("#command").addEventListener("change", () => { updateVisibility(); syncUrl(); });
    const onEdit = (e) => {
      const name = e.target.dataset && e.target.dataset.field;
      if (!name) return;
      if (name === "mode") updateVisibility();
      else markChanged();
      if (name === "model" && CONFIG) clearConfig();
      syncUrl();
    };
    $("#fields").addEventListener("input", onEdit);
    $("#fields").addEventListener("change", onEdit);

    let autorun = false;
    try {
      const [table, models, gpus] = await Promise.all([api("/v1/fields"), api("/v1/models"), api("/v1/gpus")]);
      buildForm(table, models.models || [], gpus.gpus || []);
      $("#version").textContent = table.version ? `v${table.version}` : "";
      autorun = restoreFromUrl();
      updateVisibility();
    } catch (e) {
      showError("could not load the field table: " + e.message);
    }
    document.body.dataset.ready = "1";
    if (autorun) $("#run").click();
  }

  // For the browser test and the console.
  window.gpumem = { colorOf, COLORS, requestBody, estimateCommand };
  init();
})();
