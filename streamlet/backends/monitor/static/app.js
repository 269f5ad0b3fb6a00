// streamlet's dashboard: plain JavaScript, no framework. It listens to /events (server-sent events, one
// message per refresh holding the cluster view and every job's view) and redraws the tables and the graph.
"use strict";

let selected = null;  // the job whose view is shown

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "–" : String(text);
  if (cls) td.className = cls;
  return td;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const td of cells) tr.appendChild(td);
  return tr;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function num(value) {
  return cell(value, "num");
}

function drawCluster(view) {
  const section = document.getElementById("cluster-section");
  section.hidden = view.cluster === null;
  document.getElementById("cluster-name").textContent = view.cluster ? `· ${view.cluster}` : "· in this process";
  const leader = view.leader;
  document.getElementById("leader").textContent = leader
    ? `leader ${leader.name} (epoch ${leader.epoch}) · masters: ${view.masters.join(", ") || "none"}`
    : (view.cluster ? "no leader" : "");
  const members = view.zookeeper || [];
  document.getElementById("zookeeper").textContent = members.length
    ? `zookeeper: ${members.map((m) => `${m.address} ${m.mode}`).join(" · ")}`
    : "";
  const problem = document.getElementById("problem");
  problem.hidden = !view.problem;
  problem.textContent = view.problem ? `not fresh: ${view.problem}` : "";
  fill(document.querySelector("#workers tbody"), view.workers.map((w) => {
    const lost = w.state === "LOST";  // in red until it comes back or 'cluster forget-worker' removes it
    const tr = row([
      cell(w.id), cell(w.address), cell(w.state, lost ? "LOST" : null), cell(w.load, w.load), num(w.cpu),
      num(w.rss_mb), num(w.in_per_s), num(w.out_per_s), num(w.instances.length),
      cell(w.heartbeat || (w.stale ? "stale" : "ok"), lost ? "LOST" : null),
    ]);
    if (lost) tr.title = `lost: ${w.lost.why}; it held ${w.lost.jobs.join(", ") || "no job"}`;
    if (lost) tr.className = "lost";
    return tr;
  }));
  const head = document.querySelector("#matrix thead");
  const headRow = row([cell("instance"), ...view.matrix.workers.map((w) => cell(w))]);
  head.replaceChildren(headRow);
  fill(document.querySelector("#matrix tbody"), view.matrix.cells.map((c) => row([
    cell(c.instance), ...view.matrix.workers.map((w) => cell(w === c.worker ? "●" : "")),
  ])));
  fill(document.querySelector("#jobs tbody"), view.jobs.map((j) => {
    const tr = row([cell(j.name), cell(j.state, j.state), num(j.attempt), cell(j.reason)]);
    tr.className = "job" + (j.name === selected ? " selected" : "");
    tr.addEventListener("click", () => { selected = j.name; redraw(); });
    return tr;
  }));
}

function esc(text) {
  // node names are the user's strings: never markup
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function layers(graph) {
  // each node one column right of its furthest upstream node (back edges of loops ignored)
  const depth = {};
  for (const n of graph.nodes) depth[n.name] = 0;
  for (let round = 0; round < graph.nodes.length; round++) {
    for (const e of graph.edges) {
      if (depth[e.to] < depth[e.from] + 1 && depth[e.from] + 1 < graph.nodes.length) depth[e.to] = depth[e.from] + 1;
    }
  }
  return depth;
}

function drawGraph(graph) {
  const svg = document.getElementById("graph");
  const ns = "http://www.w3.org/2000/svg";
  const depth = layers(graph);
  const columns = {};
  const place = {};
  for (const n of graph.nodes) {
    const column = depth[n.name];
    columns[column] = (columns[column] || 0) + 1;
    place[n.name] = { x: 20 + column * 200, y: 20 + (columns[column] - 1) * 70 };
  }
  const width = 40 + 200 * (Math.max(0, ...Object.values(depth)) + 1);
  const height = 40 + 70 * Math.max(1, ...Object.values(columns));
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  const parts = [`<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6"
    orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#8895ab"/></marker></defs>`];
  for (const e of graph.edges) {
    const a = place[e.from], b = place[e.to];
    if (!a || !b) continue;
    const x1 = a.x + 140, y1 = a.y + 20, x2 = b.x, y2 = b.y + 20;
    parts.push(`<line x1="${x1}" y1="${y1}" x2="${x2}" y2="${y2}"></line>`);
    parts.push(`<text class="edge-rate" x="${(x1 + x2) / 2}" y="${(y1 + y2) / 2 - 4}" text-anchor="middle">` +
      `${esc(e.per_s)}/s</text>`);
  }
  for (const n of graph.nodes) {
    const p = place[n.name];
    parts.push(`<rect x="${p.x}" y="${p.y}" width="140" height="40"></rect>`);
    parts.push(`<text x="${p.x + 70}" y="${p.y + 17}" text-anchor="middle">${esc(n.name)} x${n.parallelism}</text>`);
    parts.push(`<text x="${p.x + 70}" y="${p.y + 32}" text-anchor="middle" class="muted">${esc(n.kind)}</text>`);
  }
  svg.innerHTML = parts.join("");
  svg.ns = ns;
}

function drawJob(job) {
  const section = document.getElementById("job-section");
  section.hidden = !job;
  if (!job) return;
  document.getElementById("job-name").textContent = job.name;
  const state = document.getElementById("job-state");
  state.textContent = `${job.state} · attempt ${job.attempt} · ${job.reason || ""}`;
  state.className = job.state;
  const counters = ["late", "dead_lettered", "shed", "dropped", "restarts", "checkpoints"];
  document.getElementById("job-counters").replaceChildren(...counters.map((k) => {
    const span = document.createElement("span");
    span.textContent = `${k.replace("_", " ")}: ${job[k]}`;
    return span;
  }));
  drawGraph(job.graph);
  const rows = [];
  for (const task of job.tasks) {
    for (const i of task.instances) {
      rows.push(row([
        cell(task.name), num(i.index), cell(i.worker), num(i.in_per_s), num(i.out_per_s), num(i.p50_ms),
        num(i.p99_ms), cell(i.queue, i.queue), num(i.fill), num(i.shed), num(i.loop_held),
      ]));
    }
  }
  fill(document.querySelector("#tasks tbody"), rows);
  fill(document.getElementById("timeline"), job.timeline.slice().reverse().map((event) => {
    const li = document.createElement("li");
    li.textContent = `${new Date(event.at * 1000).toLocaleTimeString()} — ${event.text}`;
    return li;
  }));
}

let latest = null;

function redraw() {
  if (!latest) return;
  drawCluster(latest.cluster);
  const names = Object.keys(latest.jobs);
  if (!selected || !(selected in latest.jobs)) {
    selected = names.find((n) => latest.jobs[n].state === "RUNNING") || names[0] || null;
  }
  drawJob(selected ? latest.jobs[selected] : null);
  document.getElementById("updated").textContent = `updated ${new Date(latest.cluster.at * 1000).toLocaleTimeString()}`;
}

const events = new EventSource("/events");
events.onmessage = (message) => {
  latest = JSON.parse(message.data);
  redraw();
};
events.onerror = () => {
  document.getElementById("updated").textContent = "reconnecting…";
};
