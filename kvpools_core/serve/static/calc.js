// kvpools calculator: the form's fields are the URL's query; /api/v1/calculator answers it as JSON, drawn here.
// Hand-written, no framework, no build step; the page works without it (the form is a plain GET of "/").
"use strict";

(function () {
  const form = document.getElementById("calc");
  const results = document.getElementById("results");
  const status = document.getElementById("status");
  const permalink = document.getElementById("permalink");
  const SVG = "http://www.w3.org/2000/svg";

  function query() {
    const params = new URLSearchParams();
    for (const [name, value] of new FormData(form)) {
      if (typeof value === "string" && value.trim() !== "") params.append(name, value.trim());
    }
    if (params.has("config")) params.delete("model"); // a pasted config wins over the preset list
    return params;
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "class") node.className = value;
      else node.setAttribute(key, value);
    }
    for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    return node;
  }

  const num = (n) => (typeof n === "number" ? n.toLocaleString("en-US") : String(n));
  const gib = (b) => (typeof b === "number" ? (b / 2 ** 30).toFixed(2) + " GiB" : "-");
  const ctx = (n) => (n % 1048576 === 0 ? n / 1048576 + "M" : n % 1024 === 0 ? n / 1024 + "k" : num(n));

  function table(id, head, rows) {
    const t = el("table", { id: id });
    t.append(el("thead", {}, el("tr", {}, ...head.map(([text, cls]) => el("th", cls ? { class: cls } : {}, text)))));
    const body = el("tbody");
    for (const row of rows) body.append(row);
    t.append(body);
    return t;
  }

  function card(id, value, label) {
    return el("div", { class: "card", id: id }, el("b", {}, value), el("span", {}, label));
  }

  function bindClass(binding) {
    if (binding.startsWith("state")) return "bind-state";
    if (binding.startsWith("swa")) return "bind-swa";
    if (binding === "request cap") return "bind-cap";
    return "";
  }

  // Concurrency per context length: one bar per context, coloured by what binds.
  function concurrencyChart(points) {
    const w = 520, h = 230, left = 56, bottom = 36, top = 26;
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    svg.setAttribute("width", w);
    svg.setAttribute("id", "chart-concurrency");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", "Concurrent requests per context length");
    const max = Math.max(1, ...points.map((p) => p.value));
    const step = (w - left - 10) / Math.max(1, points.length);
    const add = (tag, attrs, text) => {
      const node = document.createElementNS(SVG, tag);
      for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
      if (text !== undefined) node.textContent = text;
      svg.append(node);
      return node;
    };
    add("line", { x1: left, y1: h - bottom, x2: w - 6, y2: h - bottom, stroke: "#c4cad6" });
    add("text", { x: left - 6, y: top + 4, "text-anchor": "end" }, num(max));
    add("text", { x: left - 6, y: h - bottom, "text-anchor": "end" }, "0");
    add("text", { x: 4, y: 11 }, "concurrent requests");
    points.forEach((p, i) => {
      const bh = ((h - bottom - top) * p.value) / max;
      const x = left + i * step + step * 0.15;
      const bar = add("rect", { x: x, y: h - bottom - bh, width: step * 0.7, height: Math.max(bh, 0.5), class: "bar " + bindClass(p.binding) });
      const tip = document.createElementNS(SVG, "title");
      tip.textContent = `${ctx(p.context)}: ${num(p.value)} (${p.binding})`;
      bar.append(tip);
      add("text", { x: x + step * 0.35, y: h - bottom + 14, "text-anchor": "middle" }, ctx(p.context));
      add("text", { x: x + step * 0.35, y: h - bottom - bh - 3, "text-anchor": "middle" }, num(p.value));
    });
    add("text", { x: (w + left) / 2, y: h - 4, "text-anchor": "middle" }, "context length (tokens)");
    return svg;
  }

  // The whole GPU, term by term: runtime, weights, slack, the planned KV pools, what the budget leaves unused.
  function memoryChart(budget, planned) {
    const total = budget.gpu_total_bytes;
    if (!total) return null;
    const terms = [
      ["runtime", budget.runtime_bytes || 0, "#7a8699"],
      ["weights", budget.weights_bytes || 0, "#d17a22"],
      ["slack", budget.slack_bytes || 0, "#c4cad6"],
      ["reserved", budget.reserved_bytes || 0, "#8a5cd1"],
      ["KV pools", planned, "#2f6fd6"],
    ];
    const used = terms.reduce((s, t) => s + t[1], 0);
    terms.push(["unused", Math.max(0, total - used), "#eef1f6"]);
    const w = 520, h = 80, svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    svg.setAttribute("width", w);
    svg.setAttribute("id", "chart-memory");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", "GPU memory, term by term");
    let x = 0;
    terms.forEach(([name, bytes, colour], i) => {
      const width = (w * bytes) / Math.max(total, used);
      const rect = document.createElementNS(SVG, "rect");
      Object.entries({ x: x, y: 8, width: Math.max(width, 0), height: 26, fill: colour }).forEach(([k, v]) => rect.setAttribute(k, v));
      const tip = document.createElementNS(SVG, "title");
      tip.textContent = `${name}: ${gib(bytes)}`;
      rect.append(tip);
      svg.append(rect);
      const label = document.createElementNS(SVG, "text");
      label.setAttribute("x", 4 + (i % 3) * 172);
      label.setAttribute("y", 52 + Math.floor(i / 3) * 14);
      label.textContent = `■ ${name} ${gib(bytes)}`;
      label.setAttribute("style", `fill:${colour === "#eef1f6" ? "#9aa3b2" : colour}`);
      svg.append(label);
      x += width;
    });
    return svg;
  }

  function renderSglang(answer) {
    const cap = answer.capacity, plan = answer.plan, out = el("section", { class: "answer", id: "answer" });
    out.append(el("h2", {}, `${plan.model.name} — ${answer.accounting} accounting`));
    const cards = el("div", { class: "cards" });
    for (const [space, n] of Object.entries(cap.counts.tokens)) cards.append(card(`tokens-${space}`, num(n), `${space} tokens`));
    if (cap.counts.state_slots) cards.append(card("state-slots", num(cap.counts.state_slots), "state slots"));
    cards.append(card("max-running", num(plan.max_running_requests), "max running requests"));
    cards.append(card("budget", gib(plan.budget_bytes), "KV budget"));
    cards.append(card("single", num(cap.max_context.single_request.context_len), "longest single request"));
    out.append(cards);
    out.append(el("h3", {}, "Concurrent requests per context length" + (cap.dp_workers > 1 ? ` (per DP worker, ${cap.dp_workers} workers)` : "")));
    const rows = cap.ladder.map((row, i) =>
      el("tr", { "data-context": row.context_len, "data-concurrent": row.concurrent_requests },
        el("td", { class: "n" }, ctx(row.context_len)), el("td", { class: "n" }, num(row.concurrent_requests)),
        el("td", { class: "binds" }, row.binding), el("td", {}, cap.why[i])));
    const charts = el("div", { class: "charts" });
    charts.append(concurrencyChart(cap.ladder.map((r) => ({ context: r.context_len, value: r.concurrent_requests, binding: r.binding }))));
    const memory = memoryChart(plan.budget, plan.planned_bytes);
    if (memory) charts.append(memory);
    out.append(charts);
    out.append(table("ladder", [["context", "n"], ["concurrent requests", "n"], ["binds"], ["why"]], rows));
    out.append(el("h3", {}, "Pools (bytes per group)"));
    out.append(table("pools", [["pool"], ["kind"], ["slots", "n"], ["bytes per slot", "n"], ["size", "n"]],
      plan.pools.map((p) => el("tr", {}, el("td", {}, p.name), el("td", {}, p.kind), el("td", { class: "n" }, num(p.slots)),
        el("td", { class: "n" }, num(p.bytes_per_slot)), el("td", { class: "n" }, gib(p.bytes))))));
    out.append(el("h3", {}, "Cost per group"), el("ol", { class: "steps" }, ...plan.cost_lines.map((l) => el("li", {}, l))));
    out.append(el("h3", {}, "Budget, term by term"), el("ol", { class: "steps", id: "budget-steps" }, ...(plan.budget.steps || []).map((s) => el("li", {}, s))));
    if (plan.notes.length) out.append(el("h3", {}, "Notes"), el("ul", {}, ...plan.notes.map((n) => el("li", {}, n))));
    if (cap.launch) out.append(el("h3", {}, "Launch"), el("pre", { class: "launch", id: "launch" }, cap.launch));
    else if (cap.flags && cap.flags.error) out.append(el("p", { class: "error" }, cap.flags.error));
    return out;
  }

  function renderVllm(answer) {
    const cap = answer.capacity, plan = answer.plan, out = el("section", { class: "answer", id: "answer" });
    out.append(el("h2", {}, `${plan.model} — vLLM ${plan.vllm_version} accounting`));
    out.append(el("div", { class: "cards" },
      card("blocks", num(plan.num_gpu_blocks), "GPU blocks"), card("block-size", num(plan.block_size), "tokens per block"),
      card("tokens-full", num(plan.kv_cache_size_tokens), "KV cache tokens"), card("max-model-len", num(plan.max_model_len), "max model len")));
    const rows = cap.capacity.map((row) => el("tr", { "data-context": row.context_len, "data-concurrent": row.max_concurrency },
      el("td", { class: "n" }, ctx(row.context_len)), el("td", { class: "n" }, num(row.max_concurrency)), el("td", {}, "vLLM's max_concurrency")));
    out.append(el("div", { class: "charts" }, concurrencyChart(cap.capacity.map((r) => ({ context: r.context_len, value: r.max_concurrency, binding: "blocks" })))));
    out.append(table("ladder", [["context", "n"], ["max concurrency", "n"], ["formula"]], rows));
    out.append(el("h3", {}, "KV cache groups"));
    out.append(table("pools", [["spec"], ["layers", "n"], ["block size", "n"], ["bytes per block", "n"]],
      plan.kv_cache_groups.map((g) => el("tr", {}, el("td", {}, g.spec), el("td", { class: "n" }, num(g.num_layers)),
        el("td", { class: "n" }, num(g.block_size)), el("td", { class: "n" }, num(g.page_size_bytes))))));
    out.append(el("h3", {}, "Launch"), el("pre", { class: "launch", id: "launch" }, cap.launch));
    return out;
  }

  function showError(message) {
    results.replaceChildren(el("div", { class: "error", role: "alert" }, el("strong", {}, "Error: "), message));
  }

  async function calculate(push) {
    const params = query();
    if (!params.has("model") && !params.has("config")) return;
    const search = "?" + params.toString();
    if (push) history.replaceState(null, "", search);
    permalink.href = search;
    permalink.hidden = false;
    status.textContent = "calculating…";
    try {
      const response = await fetch("/api/v1/calculator" + search, { headers: { Accept: "application/json" } });
      const body = await response.json();
      if (!response.ok) {
        showError(body.error ? body.error.message : response.statusText);
      } else {
        const answer = body.result;
        results.replaceChildren(answer.accounting === "vllm" ? renderVllm(answer) : renderSglang(answer));
      }
      status.textContent = "";
    } catch (error) {
      status.textContent = "";
      showError(String(error));
    }
    document.body.dataset.ready = "1";
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    calculate(true);
  });
  document.getElementById("config-file").addEventListener("change", async (event) => {
    const file = event.target.files[0];
    if (file) document.getElementById("config").value = await file.text();
  });
  if (location.search) calculate(false);
  else document.body.dataset.ready = "1";
})();
