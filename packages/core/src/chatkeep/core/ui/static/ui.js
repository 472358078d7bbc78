// chatkeep ui: a little progressive enhancement. Every page works without it.
"use strict";
(function () {
  // Buttons to open or close every long argument and result of a transcript at once.
  var tools = document.getElementById("tools");
  var folds = document.querySelectorAll("details.long");
  if (tools && folds.length) {
    [["Expand all", true], ["Collapse all", false]].forEach(function (pair) {
      var button = document.createElement("button");
      button.type = "button";
      button.textContent = pair[0];
      button.addEventListener("click", function () {
        folds.forEach(function (fold) { fold.open = pair[1]; });
      });
      tools.appendChild(button);
    });
  }
  // Times are printed in UTC; the reader's own time zone goes in the tooltip.
  document.querySelectorAll("time[datetime]").forEach(function (node) {
    var moment = new Date(node.getAttribute("datetime"));
    if (!isNaN(moment)) node.title = moment.toLocaleString();
  });
  // A link to a message inside a long result opens that message's folds.
  var target = location.hash && document.getElementById(decodeURIComponent(location.hash.slice(1)));
  if (target) target.querySelectorAll("details.long").forEach(function (fold) { fold.open = true; });
})();
