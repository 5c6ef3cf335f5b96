// aiacc view: the page's behaviour (inlined into the report). Pan and zoom come from svg-pan-zoom;
// one click listener per graph panel (event delegation) keeps large graphs responsive.
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("aiacc-data").textContent);
  var zoomers = {};

  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c];
    });
  }
  function count(n) {
    if (n === null || n === undefined) return "unknown";
    var units = [["T", 1e12], ["G", 1e9], ["M", 1e6], ["K", 1e3]];
    for (var i = 0; i < units.length; i++) if (Math.abs(n) >= units[i][1]) return (n / units[i][1]).toFixed(2) + " " + units[i][0];
    return String(n);
  }
  function panelOf(id) { return id.charAt(0) === "a" ? "after" : "before"; }
  function facts(id) { return (DATA.graphs[panelOf(id)] || {}).nodes[id]; }
  function link(panel, name) {
    var g = DATA.graphs[panel];
    var id = g && g.ids[name];
    return id ? '<a data-goto="' + id + '">' + esc(name) + "</a>" : esc(name);
  }
  function clear(cls) {
    var els = document.querySelectorAll("g.irnode." + cls);
    for (var i = 0; i < els.length; i++) els[i].classList.remove(cls);
  }

  function show(id) {
    var f = facts(id);
    var info = document.getElementById("info");
    if (!f) return;
    clear("selected"); clear("linked");
    var el = document.getElementById(id);
    if (el) el.classList.add("selected");
    var panel = panelOf(id), other = panel === "after" ? "before" : "after";
    var rows = [];
    rows.push(["op", esc(f.op) + (f.opaque ? " <b>(opaque: kept as the framework's own)</b>" : "")]);
    var layers = f.sources && f.sources.length ? f.sources : (f.source ? [f.source] : []);
    rows.push([layers.length > 1 ? "layers" : "layer", layers.length ? layers.map(esc).join("<br>") : "(no framework layer recorded; node name " + esc(f.name) + ")"]);
    rows.push(["FLOPs", count(f.flops)]);
    var attrs = Object.keys(f.attrs);
    rows.push(["attributes", attrs.length ? attrs.map(function (k) { return "<b>" + esc(k) + "</b> = " + esc(f.attrs[k]); }).join("<br>") : "(none)"]);
    rows.push(["inputs", f.inputs.map(function (v) {
      return esc(v.name) + " <i>" + esc(v.type) + "</i>" + (v.from ? " from " + (v.from === "constant" || v.from === "graph input" ? esc(v.from) : link(panel, v.from)) : "");
    }).join("<br>") || "(none)"]);
    rows.push(["outputs", f.outputs.map(function (v) {
      return esc(v.name) + " <i>" + esc(v.type) + "</i>" + (v.to.length ? " to " + v.to.map(function (n) { return link(panel, n); }).join(", ") : "");
    }).join("<br>")]);
    if (f.fused_from && f.fused_from.length) {
      rows.push(["fused by", esc(f.rule || "?")]);
      rows.push(["replaced", f.fused_from.map(function (n) { return link("before", n); }).join(", ")]);
      f.fused_from.forEach(function (n) {
        var bid = DATA.graphs.before && DATA.graphs.before.ids[n];
        if (bid) document.getElementById(bid).classList.add("linked");
      });
    }
    if (panel === "before" && DATA.replaced_by) {
      var by = DATA.replaced_by[f.name];
      if (by && by.length) {
        rows.push(["replaced by", by.map(function (n) { return link("after", n); }).join(", ")]);
        by.forEach(function (n) {
          var aid = DATA.graphs.after.ids[n];
          if (aid) document.getElementById(aid).classList.add("linked");
        });
      } else if (DATA.graphs.after) {
        rows.push(["after", DATA.graphs.after.ids[f.name] ? "kept: " + link("after", f.name) : "removed by the passes"]);
      }
    }
    info.innerHTML = '<h3 id="info-title">' + esc(f.name) + "</h3><table>" + rows.map(function (r) {
      return '<tr><td class="k">' + r[0] + "</td><td>" + r[1] + "</td></tr>";
    }).join("") + "</table>";
    info.setAttribute("data-node", id);
  }

  function focus(id) {
    var el = document.getElementById(id), pz = zoomers[panelOf(id)];
    if (!el || !pz) return;
    var box = el.getBoundingClientRect(), canvas = el.ownerSVGElement.getBoundingClientRect();
    pz.panBy({x: canvas.left + canvas.width / 2 - (box.left + box.width / 2),
              y: canvas.top + canvas.height / 2 - (box.top + box.height / 2)});
  }
  window.aiaccSelect = function (id) { show(id); focus(id); };

  ["before", "after"].forEach(function (panel) {
    var canvas = document.getElementById("canvas-" + panel);
    if (!canvas) return;
    var svg = canvas.querySelector("svg");
    svg.removeAttribute("width"); svg.removeAttribute("height");
    zoomers[panel] = svgPanZoom(svg, {zoomEnabled: true, controlIconsEnabled: true, fit: true, center: true,
                                      minZoom: 0.02, maxZoom: 50, dblClickZoomEnabled: false});
    // a tall graph fitted whole is unreadable: start at its top, as wide as the panel allows (at most 1:1)
    var pz = zoomers[panel], sz = pz.getSizes();
    var z = Math.min(sz.width / sz.viewBox.width, 1.0);
    if (z > sz.realZoom) {
      pz.zoom(z / sz.realZoom * pz.getZoom());
      pz.pan({x: (sz.width - sz.viewBox.width * z) / 2, y: 8});
    }
    canvas.addEventListener("click", function (ev) {
      var g = ev.target.closest ? ev.target.closest("g.irnode") : null;
      if (g) show(g.id);
    });
  });
  document.getElementById("info").addEventListener("click", function (ev) {
    var id = ev.target.getAttribute && ev.target.getAttribute("data-goto");
    if (id) window.aiaccSelect(id);
  });
  var passLinks = document.querySelectorAll("[data-goto]");
  for (var i = 0; i < passLinks.length; i++) {
    passLinks[i].addEventListener("click", function (ev) { window.aiaccSelect(ev.currentTarget.getAttribute("data-goto")); });
  }
  document.body.setAttribute("data-ready", "1");
})();
