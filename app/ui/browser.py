"""Scripts the page runs in the visitor's browser, installed by ``app.main``. They change how figures are
drawn, never what a handler returns, and ask the server for nothing (the timeline's click presses a
hidden button of the page)."""

from visualize.palette import CURRENT_ROUND_COLOR

# A figure drawn while its tab is hidden gets Plotly's fallback width (700 px) and keeps it until the window
# is resized. Each figure's box is watched instead: when it changes (its tab opens), the figure is fitted to it.
FIT_PLOTS_JS = """() => {
  if (window.__dexFit) return;
  const fit = new ResizeObserver(entries => entries.forEach(e => {
    const gd = e.target.querySelector('.js-plotly-plot'), width = e.contentRect.width;
    if (gd && gd._fullLayout && window.Plotly && width > 0 && Math.abs(gd._fullLayout.width - width) > 2)
      window.Plotly.Plots.resize(gd);
  }));
  window.__dexFit = setInterval(() => document.querySelectorAll('.js-plotly-plot').forEach(gd => {
    const box = gd.parentElement;
    if (box && !box.__dexFit) { box.__dexFit = true; fit.observe(box); }
  }), 500);
}"""

# Gradio's slider commits a typed round when its number box loses focus (its release event), not on Enter; the
# round box blurs itself on Enter, so Enter shows the round typed, as Tab does.
ROUND_ENTER_JS = """() => {
  if (window.__dexRoundEnter) return;
  window.__dexRoundEnter = true;
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && e.target.matches && e.target.matches('#dbg-round input[type=number]')) e.target.blur();
  }, true);
}"""

# The depth view carries both of its colourings (``visualize.charts.depth_colouring``): the Analysis tab's
# switch restyles the figure it shows, with no request and no model call.
DEPTH_COLOURS_JS = """(metric) => {
  const gd = document.querySelector('#an-depth .js-plotly-plot');
  const colouring = gd?.layout?.meta?.colourings?.[metric === 'rank' ? 'rank' : 'prob'];
  if (colouring && window.Plotly) window.Plotly.restyle(gd, colouring, [0]);
}"""

# Plotly reports clicks on the timeline's points; the point's customdata is its round. The handler writes
# the round into a hidden box and presses a hidden button, whose event moves the Debugger there. The same
# watcher marks the round the Debugger shows on the timeline: a translucent band over the positions of the
# nodes that round created, moved in the browser when the round control changes (no server work, no
# redraw of the figure) and laid again when a new timeline arrives. The timeline opens at a window of the run's
# positions (``visualize.timeline``); when the round changes (Prev, Next, Play, the round box) to one whose band
# lies outside the x range shown, the view pans to centre it (or to its start, where it is wider than the view), at
# the same zoom. A new timeline keeps its opening window.
TIMELINE_JS = """() => {
  if (window.__dexTimeline) return;
  const band = (gd, round) => {
    let lo = Infinity, hi = -Infinity;
    for (const t of gd.data) {
      if (t.mode !== 'markers' || t.name === 'collapses' || !t.customdata) continue;
      t.customdata.forEach((r, i) => { if (r === round) { lo = Math.min(lo, t.x[i]); hi = Math.max(hi, t.x[i]); } });
    }
    return lo <= hi ? [lo - 0.5, hi + 0.5] : null;
  };
  window.__dexTimeline = setInterval(() => {
    const gd = document.querySelector('#dbg-timeline .js-plotly-plot');
    if (!gd || !gd.on || !gd.data || !gd.layout) return;
    if (!gd.__dexClick) {
      gd.__dexClick = true;
      gd.on('plotly_click', (ev) => {
        const point = ev && ev.points && ev.points[0];
        if (!point || point.customdata === undefined || point.customdata === null) return;
        const box = document.querySelector('#dbg-goto textarea, #dbg-goto input');
        box.value = String(point.customdata);
        box.dispatchEvent(new Event('input', {bubbles: true}));
        setTimeout(() => document.querySelector('#dbg-goto-go').click(), 50);
      });
    }
    const input = document.querySelector('#dbg-round input[type=number]');
    const round = input ? Number(input.value) : NaN;
    const seen = gd.__dexBand;
    if (!window.Plotly || (seen && seen.data === gd.data && seen.round === round)) return;
    const moved = seen && seen.data === gd.data;  // the round changed on the same timeline
    gd.__dexBand = {data: gd.data, round: round};
    const x = band(gd, round);
    const shapes = (gd.layout.shapes || []).filter(s => s.name !== 'current round');
    if (x) shapes.push({name: 'current round', type: 'rect', xref: 'x', yref: 'paper', x0: x[0], x1: x[1],
                        y0: 0, y1: 1, fillcolor: 'BAND_COLOR', opacity: 0.5, line: {width: 0}, layer: 'below'});
    const update = {shapes: shapes}, shown = gd._fullLayout?.xaxis?.range;
    if (moved && x && shown && (x[0] < shown[0] || x[1] > shown[1])) {
      const width = shown[1] - shown[0];  // centred, or from its start where the band is wider than the view
      const start = x[1] - x[0] < width ? (x[0] + x[1] - width) / 2 : x[0] - 0.05 * width;
      update['xaxis.range'] = [start, start + width];
    }
    window.Plotly.relayout(gd, update);
  }, 300);
}""".replace("BAND_COLOR", CURRENT_ROUND_COLOR)
