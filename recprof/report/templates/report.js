/* recprof report behaviour: draw the plotly figures from the embedded JSON, sort tables.
   Figures arrive as data (JSON.parse of the application/json script block), never as
   code, so trace-derived strings cannot execute. */
(function () {
  "use strict";
  var figures = JSON.parse(document.getElementById("recprof-figures").textContent);
  var config = { displaylogo: false, responsive: true };
  Object.keys(figures).forEach(function (id) {
    var el = document.getElementById(id);
    if (el) { Plotly.newPlot(el, figures[id].data, figures[id].layout, config); }
  });

  function cellValue(row, index) {
    var cell = row.cells[index];
    var key = cell.getAttribute("data-sort");
    if (key !== null && key !== "" && !isNaN(Number(key))) { return Number(key); }
    return cell.textContent;
  }

  document.querySelectorAll("table.sortable").forEach(function (table) {
    var heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th, index) {
      th.addEventListener("click", function () {
        var asc = th.getAttribute("aria-sort") !== "ascending";
        Array.prototype.forEach.call(heads, function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", asc ? "ascending" : "descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = cellValue(a, index), y = cellValue(b, index);
          var c = (typeof x === "number" && typeof y === "number") ? x - y
            : String(x).localeCompare(String(y));
          return asc ? c : -c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
})();
