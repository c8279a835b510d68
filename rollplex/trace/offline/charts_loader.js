/* rollplex: an offline stand-in for https://www.gstatic.com/charts/loader.js, for
 * torch-tb-profiler's pages where Google's servers cannot be reached (air-gapped clusters).
 * It implements the few google.visualization calls the plugin makes and draws them plainly:
 * tables as HTML tables, line / stepped-area / combo / column charts as SVG polylines or
 * bars, pie charts as a list of shares, the timeline as a list. Not Google Charts: no
 * tooltips or zoom; the numbers are the plugin's own. */
(function () {
  "use strict";
  function DataTable(spec) {
    this.cols = [];
    this.rows = [];
    if (spec && spec.cols) {
      this.cols = spec.cols.slice();
      this.rows = (spec.rows || []).map(function (r) {
        return r.c.map(function (c) { return c && typeof c === "object" ? c.v : c; });
      });
    }
  }
  DataTable.prototype.addColumn = function (c, label) {
    this.cols.push(typeof c === "string" ? { type: c, label: label || "" } : c);
    return this.cols.length - 1;
  };
  DataTable.prototype.addRows = function (rows) {
    if (typeof rows === "number") { for (var i = 0; i < rows; i++) this.rows.push([]); return; }
    for (var j = 0; j < rows.length; j++) this.rows.push(rows[j].slice());
  };
  DataTable.prototype.addRow = function (r) { this.rows.push((r || []).slice()); };
  DataTable.prototype.setProperty = function () {};
  DataTable.prototype.setCell = function (r, c, v) { this.rows[r][c] = v; };
  DataTable.prototype.getNumberOfRows = function () { return this.rows.length; };
  DataTable.prototype.getNumberOfColumns = function () { return this.cols.length; };
  DataTable.prototype.getValue = function (r, c) { return this.rows[r][c]; };
  DataTable.prototype.getColumnLabel = function (c) { return this.cols[c].label || ""; };
  function cell(v) { return v && typeof v === "object" && "v" in v ? v.v : v; }
  function dataCols(dt) {  // plain data columns: no role (tooltip, style, annotation)
    var out = [];
    for (var c = 1; c < dt.cols.length; c++) if (!dt.cols[c].role) out.push(c);
    return out;
  }
  function title(el, opts) {
    if (opts && opts.title) {
      var h = document.createElement("div");
      h.textContent = opts.title;
      h.style.cssText = "font:bold 13px sans-serif;margin:4px 0";
      el.appendChild(h);
    }
  }
  var COLOURS = ["#3366cc", "#dc3912", "#ff9900", "#109618", "#990099", "#0099c6", "#66aa00", "#8b0707"];
  function Chart(el, kind) { this.el = el; this.kind = kind; }
  Chart.prototype.getSelection = function () { return []; };
  Chart.prototype.setSelection = function () {};
  Chart.prototype.clearChart = function () { this.el.innerHTML = ""; };
  Chart.prototype.draw = function (dt, opts) {
    var el = this.el;
    el.innerHTML = "";
    title(el, opts);
    if (this.kind === "Table" || this.kind === "Timeline") return table(el, dt);
    if (this.kind === "PieChart") return pie(el, dt);
    return plot(el, dt, opts || {}, this.kind);
  };
  function table(el, dt) {
    var t = document.createElement("table");
    t.style.cssText = "border-collapse:collapse;font:12px sans-serif";
    var head = t.insertRow();
    dt.cols.forEach(function (c) {
      var th = document.createElement("th");
      th.textContent = c.label || "";
      th.style.cssText = "border:1px solid #ccc;padding:2px 6px;background:#f3f3f3";
      head.appendChild(th);
    });
    dt.rows.forEach(function (r) {
      var tr = t.insertRow();
      r.forEach(function (v) {
        var td = tr.insertCell();
        v = cell(v);
        td.textContent = typeof v === "number" ? +v.toFixed(3) : v == null ? "" : String(v);
        td.style.cssText = "border:1px solid #ddd;padding:2px 6px";
      });
    });
    el.appendChild(t);
  }
  function pie(el, dt) {
    var total = 0;
    dt.rows.forEach(function (r) { total += +cell(r[1]) || 0; });
    var ul = document.createElement("ul");
    ul.style.cssText = "font:12px sans-serif";
    dt.rows.forEach(function (r, i) {
      var li = document.createElement("li");
      var v = +cell(r[1]) || 0;
      li.textContent = cell(r[0]) + ": " + v + (total ? " (" + (100 * v / total).toFixed(1) + "%)" : "");
      li.style.color = COLOURS[i % COLOURS.length];
      ul.appendChild(li);
    });
    el.appendChild(ul);
  }
  function plot(el, dt, opts, kind) {
    var W = el.clientWidth || 800, H = (opts.height || 300) - 40, L = 70, B = 24;
    var cols = dataCols(dt), xs = dt.rows.map(function (r) { return cell(r[0]); });
    var numeric = xs.every(function (x) { return typeof x === "number"; });
    var xmin = numeric ? Math.min.apply(null, xs) : 0;
    var xmax = numeric ? Math.max.apply(null, xs) : Math.max(xs.length - 1, 1);
    var ymax = 0;
    dt.rows.forEach(function (r) { cols.forEach(function (c) { ymax = Math.max(ymax, +cell(r[c]) || 0); }); });
    ymax = ymax || 1;
    var NS = "http://www.w3.org/2000/svg", svg = document.createElementNS(NS, "svg");
    svg.setAttribute("width", W); svg.setAttribute("height", H);
    function X(i) { var x = numeric ? xs[i] : i; return L + (W - L - 10) * (x - xmin) / ((xmax - xmin) || 1); }
    function Y(v) { return H - B - (H - B - 10) * v / ymax; }
    function add(tag, attrs, text) {
      var e = document.createElementNS(NS, tag);
      for (var k in attrs) e.setAttribute(k, attrs[k]);
      if (text != null) e.textContent = text;
      svg.appendChild(e); return e;
    }
    add("line", { x1: L, y1: H - B, x2: W - 10, y2: H - B, stroke: "#999" });
    add("line", { x1: L, y1: 10, x2: L, y2: H - B, stroke: "#999" });
    add("text", { x: L, y: H - 6, "font-size": 11 }, String(xs[0]));
    add("text", { x: W - 90, y: H - 6, "font-size": 11 }, String(xs[xs.length - 1]));
    var bars = kind === "ColumnChart" || kind === "SteppedAreaChart";
    var stacked = bars && opts.isStacked, base = dt.rows.map(function () { return 0; });
    if (stacked) {
      ymax = 0;
      dt.rows.forEach(function (r) {
        var sum = 0;
        cols.forEach(function (c) { sum += +cell(r[c]) || 0; });
        ymax = Math.max(ymax, sum);
      });
      ymax = ymax || 1;
    }
    cols.forEach(function (c, k) {
      var colour = COLOURS[k % COLOURS.length];
      if (bars) {
        var slot = (W - L - 10) / Math.max(xs.length, 1), w = stacked ? slot / 2 : slot / (cols.length + 1);
        dt.rows.forEach(function (r, i) {
          var v = +cell(r[c]) || 0, x = L + slot * i + (stacked ? slot / 4 : k * w);
          var y0 = Y(base[i]), y1 = Y(base[i] + v);
          add("rect", { x: x, y: y1, width: w, height: Math.max(0, y0 - y1), fill: colour });
          if (stacked) base[i] += v;
        });
      } else {
        var pts = dt.rows.map(function (r, i) { return X(i) + "," + Y(+cell(r[c]) || 0); });
        add("polyline", { points: pts.join(" "), fill: "none", stroke: colour, "stroke-width": 1.5 });
      }
      add("text", { x: L + 10 + 160 * k, y: 22, "font-size": 11, fill: colour }, dt.cols[c].label || "");
    });
    add("text", { x: 2, y: 16, "font-size": 11 }, (+ymax.toPrecision(4)).toString());
    el.appendChild(svg);
  }
  var viz = { DataTable: DataTable, events: { addListener: function () {}, removeListener: function () {} } };
  ["LineChart", "SteppedAreaChart", "ComboChart", "ColumnChart", "PieChart", "Table", "Timeline"]
    .forEach(function (k) { viz[k] = function (el) { Chart.call(this, el, k); }; viz[k].prototype = Chart.prototype; });
  viz.arrayToDataTable = function (rows) {
    var dt = new DataTable();
    (rows[0] || []).forEach(function (h) { dt.addColumn(typeof h === "object" ? h : { type: "number", label: h }); });
    dt.addRows(rows.slice(1));
    return dt;
  };
  var ready = Promise.resolve();
  window.google = window.google || {};
  window.google.visualization = viz;
  window.google.charts = {
    load: function () { return ready; },
    setOnLoadCallback: function (cb) { ready.then(cb); },
  };
})();
