package main

import (
	"fmt"
	"image/color"
	"math"
	"slices"

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
