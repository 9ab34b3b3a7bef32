package main

import (
	"fmt"
	"image/color"
	"math"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// writeChart draws commit-to-consume p50, p99 and p99.9 against the offered
// rate, one colour per system, both axes logarithmic.
func writeChart(path string, r *Results) error {
	p := plot.New()
	p.Title.Text = "commit-to-consume latency: outbox-cdc vs polling relay"
	p.X.Label.Text = "offered load (events/s, one-row transactions)"
	p.Y.Label.Text = "latency (ms)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	var xticks plot.ConstantTicks
	for _, rate := range r.Params.Rates {
		xticks = append(xticks, plot.Tick{Value: float64(rate), Label: thousands(rate)})
	}
	p.X.Tick.Marker = xticks
	// The legend sits in room left empty right of the highest rate.
	p.Legend.Top, p.Legend.Left = true, false
	p.Add(plotter.NewGrid())

	quantiles := []struct {
		name   string
		dashes []vg.Length
		get    func(Percentiles) float64
	}{
		{"p50", nil, func(q Percentiles) float64 { return q.P50Ms }},
		{"p99", []vg.Length{vg.Points(6), vg.Points(3)}, func(q Percentiles) float64 { return q.P99Ms }},
		{"p99.9", []vg.Length{vg.Points(2), vg.Points(2)}, func(q Percentiles) float64 { return q.P999Ms }},
	}
	var systems []string
	for _, s := range r.Steady {
		if !slices.Contains(systems, s.System) {
			systems = append(systems, s.System)
		}
	}
	minY, maxY := math.Inf(1), 0.0
	for i, sys := range systems {
		col := plotutil.Color(i)
		for _, q := range quantiles {
			var xys plotter.XYs
			for _, rate := range r.Params.Rates {
				s := findSteady(r, sys, rate)
				if s == nil || s.CommitToConsume.N == 0 {
					continue
				}
				y := max(q.get(s.CommitToConsume), 0.01) // log axis: no zero
				xys = append(xys, plotter.XY{X: float64(rate), Y: y})
				minY, maxY = min(minY, y), max(maxY, y)
			}
			if len(xys) == 0 {
				continue
			}
			line, points, err := plotter.NewLinePoints(xys)
			if err != nil {
				return err
			}
			line.Color, line.Dashes, line.Width = col, q.dashes, vg.Points(1.5)
			points.Color, points.Shape = col, draw.CircleGlyph{}
			p.Add(line, points)
			p.Legend.Add(fmt.Sprintf("%s %s", sys, q.name), line, points)
		}
	}
	if maxY == 0 {
		return fmt.Errorf("no latency data")
	}
	p.Y.Min, p.Y.Max = math.Pow(10, math.Floor(math.Log10(minY))), math.Pow(10, math.Ceil(math.Log10(maxY)))
	if len(r.Params.Rates) > 0 {
		p.X.Min, p.X.Max = float64(slices.Min(r.Params.Rates))*0.8, float64(slices.Max(r.Params.Rates))*8
	}
	p.BackgroundColor = color.White
	return p.Save(10*vg.Inch, 6*vg.Inch, path)
}

// writeFrontierChart draws, for one rate, each outbox-cdc run's p99 against
// its connector + broker CPU per event: the fixed lingers as one line in
// linger order, the budgets as points, the default marked apart.
func writeFrontierChart(path string, r *Results, rate int) error {
	points := frontierPoints(r, rate)
	if len(points) == 0 {
		return fmt.Errorf("no outbox-cdc runs at %d events/s", rate)
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("p99 against CPU per event at %s events/s", thousands(rate))
	p.X.Label.Text = "connector + broker CPU per event (µs)"
	p.Y.Label.Text = "commit-to-consume p99 (ms)"
	lo, hi := math.Inf(1), 0.0
	for _, q := range points {
		lo, hi = min(lo, q.P99), max(hi, q.P99)
	}
	if hi > 10*lo { // a linear axis reads better within a decade
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	p.Add(plotter.NewGrid())
	groups := []struct {
		name  string
		keep  func(frontierPoint) bool
		line  bool
		shape draw.GlyphDrawer
	}{
		{"fixed linger, budget off", func(q frontierPoint) bool { return q.Fixed }, true, draw.CircleGlyph{}},
		{"kafka.latency_budget", func(q frontierPoint) bool { return !q.Fixed && q.System != defaultSystem }, false, draw.SquareGlyph{}},
		{"default", func(q frontierPoint) bool { return q.System == defaultSystem }, false, draw.PyramidGlyph{}},
	}
	var labels plotter.XYLabels
	for i, g := range groups {
		var xys plotter.XYs
		for _, q := range points {
			if g.keep(q) {
				xys = append(xys, plotter.XY{X: q.costUs(), Y: max(q.P99, 0.01)})
				labels.XYs = append(labels.XYs, plotter.XY{X: q.costUs(), Y: max(q.P99, 0.01)})
				labels.Labels = append(labels.Labels, " "+strings.TrimPrefix(q.System, "outbox-cdc-"))
			}
		}
		if len(xys) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(xys)
		if err != nil {
			return err
		}
		sc.Color, sc.Shape, sc.Radius = plotutil.Color(i), g.shape, vg.Points(4)
		p.Add(sc)
		p.Legend.Add(g.name, sc)
		if g.line {
			l, err := plotter.NewLine(xys)
			if err != nil {
				return err
			}
			l.Color = plotutil.Color(i)
			p.Add(l)
		}
	}
	lb, err := plotter.NewLabels(labels)
	if err != nil {
		return err
	}
	p.Add(lb)
	p.Legend.Top = true
	p.BackgroundColor = color.White
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}
