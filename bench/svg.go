package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// The chart is drawn by hand: a few rectangles and labels need no plotting
// library, and the SVG renders the same in a browser, on GitHub and in
// rsvg-convert.

const (
	chartW   = 1000
	chartH   = 470
	fontAttr = `font-family="DejaVu Sans, Helvetica, Arial, sans-serif"`
)

// series is one bar colour within the groups of a panel.
type series struct {
	name  string
	color string
}

// barGroup is one cluster of bars, one per series (NaN: no bar).
type barGroup struct {
	label    string
	sublabel string
	values   []float64
}

// refLine is a dashed horizontal line, e.g. a target.
type refLine struct {
	value float64
	label string
}

// panel is one bar chart inside the picture.
type panel struct {
	x, y, w, h float64 // plot area, axes included
	title      string
	axisLabel  string
	series     []series
	groups     []barGroup
	ref        *refLine
	valueLabel func(float64) string // above each bar
	tickLabel  func(float64) string
	empty      string // shown instead of bars when there are no groups
	// logScale draws the y axis in decades: latencies that missed their
	// target by orders of magnitude would otherwise flatten the rest.
	logScale bool
}

// chart draws the drain throughput and the steady-load latency side by side.
func chart(r *results) string {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" %s>`+"\n",
		chartW, chartH, chartW, chartH, fontAttr)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", chartW, chartH)
	in := r.info
	text(&b, chartW/2, 26, 17, "middle", "bold", "#222", "cdc-outbox benchmark")
	text(&b, chartW/2, 46, 12, "middle", "normal", "#555", fmt.Sprintf("%s · PostgreSQL %s · Kafka %s · %d cores · %s",
		in.date, in.pgVersion, in.kafkaVersion, in.cores, in.goVersion))

	drain := panel{
		x: 80, y: 110, w: 390, h: 280,
		title:     "Backlog drain: events/s (higher is better)",
		axisLabel: "events/s",
		series: []series{
			{readerRecvlogical, "#9e9e9e"},
			{readerGo, "#4c78a8"},
			{readerStreamer, "#f58518"},
			{readerStreamerEO, "#b279a2"},
		},
		valueLabel: shortNumber,
		tickLabel:  shortNumber,
		empty:      "drain skipped",
	}
	for _, d := range r.drains {
		g := barGroup{label: strings.TrimPrefix(d.name(), "drain, ")}
		for _, s := range drain.series {
			v := math.NaN()
			if rr, ok := d.reader(s.name); ok {
				v = rr.rate()
			}
			g.values = append(g.values, v)
		}
		if s, ok := d.reader(readerStreamer); ok && d.limit() > 0 {
			g.sublabel = fmt.Sprintf("streamer %.2f × limit", s.rate()/d.limit())
		}
		drain.groups = append(drain.groups, g)
	}

	lat := panel{
		x: 600, y: 110, w: 370, h: 280,
		title:     "Steady load: commit → ack latency, ms",
		axisLabel: "ms",
		series: []series{
			{"p50", "#72b7b2"},
			{"p99", "#54a24b"},
			{"p99.9", "#2f6b2a"},
		},
		ref:        &refLine{value: steadyTargets[1000].p99 * 1000, label: fmt.Sprintf("p99 target at 1,000/s: %.0f ms", steadyTargets[1000].p99*1000)},
		valueLabel: func(v float64) string { return trimFloat(v, 1) },
		tickLabel:  func(v float64) string { return trimFloat(v, 1) },
		empty:      "steady load skipped",
	}
	for _, s := range r.steady {
		g := barGroup{label: thousands(float64(s.rate)) + " events/s", sublabel: fmt.Sprintf("achieved %s/s", thousands(s.achieved))}
		if s.reader == readerStreamerEO {
			g.label += ", exactly-once"
		}
		for _, q := range []quant{s.p50, s.p99, s.p999} {
			g.values = append(g.values, q.sec*1000)
			if q.sec*1000 > 10*lat.ref.value {
				lat.logScale = true
			}
		}
		lat.groups = append(lat.groups, g)
	}
	if lat.logScale {
		lat.title += " (log scale)"
	}

	drain.draw(&b)
	lat.draw(&b)
	text(&b, chartW/2, chartH-12, 11, "middle", "normal", "#666", latencyNote)
	if in.busyWarning() != "" {
		text(&b, chartW/2, chartH-28, 11, "middle", "bold", refColor,
			fmt.Sprintf("busy machine: load average up to %.1f on %d cores (other processes competed for the CPU)", in.loadPeak, in.cores))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func (p panel) draw(b *strings.Builder) {
	text(b, p.x+p.w/2, p.y-44, 14, "middle", "bold", "#222", p.title)
	// Legend, centred above the plot; the reference line is its last entry
	// (a label on the line itself would collide with tall bars).
	const sw, gap = 12.0, 18.0
	names := make([]string, 0, len(p.series)+1)
	for _, s := range p.series {
		names = append(names, s.name)
	}
	if p.ref != nil {
		names = append(names, p.ref.label)
	}
	widths := make([]float64, len(names))
	total := gap * float64(len(names)-1)
	for i, n := range names {
		widths[i] = sw + 6 + textWidth(n, 12)
		total += widths[i]
	}
	lx := p.x + p.w/2 - total/2
	for i, n := range names {
		if i < len(p.series) {
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.0f" height="%.0f" fill="%s"/>`+"\n", lx, p.y-28, sw, sw, p.series[i].color)
		} else {
			fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="1.5" stroke-dasharray="4 2"/>`+"\n", lx, p.y-22, lx+sw, p.y-22, refColor)
		}
		text(b, lx+sw+6, p.y-18, 12, "start", "normal", "#333", n)
		lx += widths[i] + gap
	}

	// Axes.
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", p.x, p.y, p.x, p.y+p.h)
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", p.x, p.y+p.h, p.x+p.w, p.y+p.h)
	if len(p.groups) == 0 {
		text(b, p.x+p.w/2, p.y+p.h/2, 14, "middle", "normal", "#888", p.empty)
		return
	}
	top := 0.0
	for _, g := range p.groups {
		for _, v := range g.values {
			if !math.IsNaN(v) {
				top = max(top, v)
			}
		}
	}
	if p.ref != nil {
		top = max(top, p.ref.value*1.1)
	}
	var ticks []float64
	var yOf func(float64) float64
	if p.logScale {
		var lo float64
		ticks, lo, top = logTicks(p.minValue(), top)
		span := math.Log10(top) - math.Log10(lo)
		yOf = func(v float64) float64 {
			f := (math.Log10(max(v, lo)) - math.Log10(lo)) / span
			return p.y + p.h - f*p.h
		}
	} else {
		var step float64
		step, top = niceScale(top*1.06, 5) // headroom for the value labels
		for v := 0.0; v <= top+step/2; v += step {
			ticks = append(ticks, v)
		}
		yOf = func(v float64) float64 { return p.y + p.h - v/top*p.h }
	}
	for _, v := range ticks {
		y := yOf(v)
		if y < p.y+p.h-0.5 {
			fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e4e4e4"/>`+"\n", p.x+1, y, p.x+p.w, y)
		}
		text(b, p.x-6, y+4, 11, "end", "normal", "#444", p.tickLabel(v))
	}
	// Axis label, rotated along the y axis.
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="12" fill="#444" text-anchor="middle" transform="rotate(-90 %.1f %.1f)">%s</text>`+"\n",
		p.x-58, p.y+p.h/2, p.x-58, p.y+p.h/2, html.EscapeString(p.axisLabel))

	groupW := p.w / float64(len(p.groups))
	barW := min(48, groupW*0.8/float64(len(p.series)))
	for gi, g := range p.groups {
		cx := p.x + groupW*(float64(gi)+0.5)
		x0 := cx - barW*float64(len(p.series))/2
		for si, v := range g.values {
			if math.IsNaN(v) {
				continue
			}
			x := x0 + barW*float64(si)
			y := yOf(v)
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s</title></rect>`+"\n",
				x+1, y, barW-2, p.y+p.h-y, p.series[si].color, html.EscapeString(p.series[si].name+": "+p.valueLabel(v)))
			text(b, x+barW/2, y-4, 11, "middle", "normal", "#222", p.valueLabel(v))
		}
		text(b, cx, p.y+p.h+18, 12, "middle", "bold", "#333", g.label)
		if g.sublabel != "" {
			text(b, cx, p.y+p.h+34, 11, "middle", "normal", "#555", g.sublabel)
		}
	}
	if p.ref != nil && p.ref.value <= top {
		y := yOf(p.ref.value)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="1.5" stroke-dasharray="6 4"/>`+"\n", p.x, y, p.x+p.w, y, refColor)
	}
}

const refColor = "#d62728"

// minValue is the smallest positive bar value (for the bottom of a log
// axis); 1 when there is none.
func (p panel) minValue() float64 {
	m := math.Inf(1)
	for _, g := range p.groups {
		for _, v := range g.values {
			if v > 0 {
				m = min(m, v)
			}
		}
	}
	if math.IsInf(m, 1) {
		return 1
	}
	return m
}

// logTicks covers [minV, maxV] with whole decades and returns the ticks
// inside them: 1-2-5 per decade, or only the decades when there are more
// than three (the labels would crowd).
func logTicks(minV, maxV float64) (ticks []float64, lo, hi float64) {
	lo = math.Pow(10, math.Floor(math.Log10(minV)))
	hi = math.Pow(10, math.Ceil(math.Log10(maxV)))
	if hi <= lo {
		hi = lo * 10
	}
	mults := []float64{1, 2, 5}
	if hi/lo > 1001 {
		mults = []float64{1}
	}
	for d := lo; d < hi*1.001; d *= 10 {
		for _, m := range mults {
			if v := d * m; v <= hi*1.001 {
				ticks = append(ticks, v)
			}
		}
	}
	return ticks, lo, hi
}

// text writes one escaped <text> element.
func text(b *strings.Builder, x, y float64, size int, anchor, weight, color, s string) {
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="%d" text-anchor="%s" font-weight="%s" fill="%s">%s</text>`+"\n",
		x, y, size, anchor, weight, color, html.EscapeString(s))
}

// textWidth estimates a label's width for laying out the legend (about
// 0.6 em per character in a sans-serif font).
func textWidth(s string, size int) float64 { return float64(len([]rune(s))) * float64(size) * 0.6 }

// niceScale picks an axis step of 1, 2, 2.5 or 5 × 10^k so that about n
// steps cover maxV, and the axis top (a whole number of steps ≥ maxV).
func niceScale(maxV float64, n int) (step, top float64) {
	if !(maxV > 0) || math.IsInf(maxV, 0) {
		return 1, 1
	}
	raw := maxV / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if step = m * mag; step >= raw {
			break
		}
	}
	top = math.Ceil(maxV/step-1e-9) * step
	return step, top
}

// shortNumber formats throughput compactly: 1,234,567 → 1.23M, 152,345 →
// 152k, 950 → 950.
func shortNumber(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return trimFloat(v/1e6, 2) + "M"
	case a >= 1e4:
		return trimFloat(v/1e3, 0) + "k"
	case a >= 1e3:
		return trimFloat(v/1e3, 1) + "k"
	default:
		return trimFloat(v, 0)
	}
}

// trimFloat formats with at most prec decimals and no trailing zeros.
func trimFloat(v float64, prec int) string {
	s := fmt.Sprintf("%.*f", prec, v)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}
