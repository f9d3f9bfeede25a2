package main

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/gpushare/gpushare/test/packing"
)

// styleOf is a run's line: one colour per run, the FFD reference dashed black.
func styleOf(name string) draw.LineStyle {
	switch name {
	case "bestfit":
		return draw.LineStyle{Color: color.RGBA{R: 31, G: 119, B: 180, A: 255}, Width: vg.Points(1.6)}
	case "firstfit":
		return draw.LineStyle{Color: color.RGBA{R: 255, G: 127, B: 14, A: 255}, Width: vg.Points(1.2)}
	case "spread":
		return draw.LineStyle{Color: color.RGBA{R: 44, G: 160, B: 44, A: 255}, Width: vg.Points(1.2)}
	case "bestfit/random":
		return draw.LineStyle{Color: color.RGBA{R: 148, G: 103, B: 189, A: 255}, Width: vg.Points(1), Dashes: []vg.Length{vg.Points(3), vg.Points(2)}}
	case "bestfit/blind":
		return draw.LineStyle{Color: color.RGBA{R: 214, G: 39, B: 40, A: 255}, Width: vg.Points(1), Dashes: []vg.Length{vg.Points(1), vg.Points(2)}}
	case "dra":
		return draw.LineStyle{Color: color.RGBA{R: 140, G: 86, B: 75, A: 255}, Width: vg.Points(1.2)}
	case "dra/lowest":
		return draw.LineStyle{Color: color.RGBA{R: 227, G: 119, B: 194, A: 255}, Width: vg.Points(1), Dashes: []vg.Length{vg.Points(3), vg.Points(2)}}
	case "dra/nvlink":
		return draw.LineStyle{Color: color.RGBA{R: 23, G: 190, B: 207, A: 255}, Width: vg.Points(1), Dashes: []vg.Length{vg.Points(1), vg.Points(2)}}
	case "ffd":
		return draw.LineStyle{Color: color.Black, Width: vg.Points(1), Dashes: []vg.Length{vg.Points(5), vg.Points(3)}}
	}
	return draw.LineStyle{Color: color.Gray{Y: 128}, Width: vg.Points(1)}
}

// figure is one PNG: a panel per scenario, a line per run.
type figure struct {
	file, ylabel string
	// y returns a sample's value in percent.
	y func(r packing.Report, s packing.Sample) float64
	// ffd adds the FFD reference where samples carry it.
	ffd bool
	// legendTop puts the legend in the top left corner, else bottom right.
	legendTop bool
}

func writePlots(dir string, reports []packing.Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	figures := []figure{
		{file: "packing-allocated.png", ylabel: "allocated, % of GPU memory", ffd: true,
			y: func(r packing.Report, s packing.Sample) float64 { return pctOf(r, float64(s.AllocatedGiB)) }},
		{file: "packing-fragmentation.png", ylabel: "fragmented, % of GPU memory", legendTop: true,
			y: func(r packing.Report, s packing.Sample) float64 { return pctOf(r, float64(s.FragmentedGiB)) }},
		{file: "packing-stranded.png", ylabel: "stranded, % of GPU memory", legendTop: true,
			y: func(r packing.Report, s packing.Sample) float64 { return pctOf(r, s.StrandedGiB) }},
	}
	for _, f := range figures {
		if err := drawFigure(filepath.Join(dir, f.file), f, reports); err != nil {
			return fmt.Errorf("%s: %w", f.file, err)
		}
	}
	return nil
}

func drawFigure(path string, f figure, reports []packing.Report) error {
	const cols = 2
	rows := (len(reports) + cols - 1) / cols
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
	}
	for i, r := range reports {
		p := plot.New()
		sc := r.Scenario
		p.Title.Text = fmt.Sprintf("%s: %s, %s mix, load %.1f", sc.Name, sc.Fleet.Name, sc.Gen.Mix.Name, sc.Gen.Load)
		p.Title.TextStyle.Font.Size = vg.Points(10)
		p.X.Label.Text = "hours"
		p.Y.Label.Text = f.ylabel
		p.Y.Label.TextStyle.Font.Size = vg.Points(9)
		p.Y.Min = 0
		p.Add(plotter.NewGrid())
		// The steady window starts at the warm-up: a vertical grey line.
		warm := plotter.XYs{{X: sc.Warmup / 3600, Y: 0}, {X: sc.Warmup / 3600, Y: 0}}
		var ymin, ymax float64 = 100, 0
		for _, c := range r.Churn {
			for _, s := range c.Result.Samples {
				v := f.y(r, s)
				ymin, ymax = min(ymin, v), max(ymax, v)
			}
		}
		for _, c := range r.Churn {
			xys := make(plotter.XYs, 0, len(c.Result.Samples))
			for _, s := range c.Result.Samples {
				xys = append(xys, plotter.XY{X: s.T / 3600, Y: f.y(r, s)})
			}
			l, err := plotter.NewLine(xys)
			if err != nil {
				return err
			}
			l.LineStyle = styleOf(c.Run)
			p.Add(l)
			if i == 0 {
				p.Legend.Add(c.Run, l)
			}
		}
		if f.ffd && len(r.Churn) > 0 {
			var xys plotter.XYs
			for _, s := range r.Churn[0].Result.Samples {
				if s.Ref != nil {
					v := pctOf(r, float64(s.Ref.PlacedGiB))
					xys = append(xys, plotter.XY{X: s.T / 3600, Y: v})
					ymax = max(ymax, v)
				}
			}
			if len(xys) > 0 {
				l, err := plotter.NewLine(xys)
				if err != nil {
					return err
				}
				l.LineStyle = styleOf("ffd")
				p.Add(l)
				if i == 0 {
					p.Legend.Add("FFD of the same pods (offline)", l)
				}
			}
		}
		warm[0].Y, warm[1].Y = ymin, ymax
		wl, err := plotter.NewLine(warm)
		if err != nil {
			return err
		}
		wl.LineStyle = draw.LineStyle{Color: color.Gray{Y: 160}, Width: vg.Points(0.8), Dashes: []vg.Length{vg.Points(1), vg.Points(2)}}
		p.Add(wl)
		if i == 0 {
			p.Legend.Add("end of warm-up", wl)
			p.Legend.Top = f.legendTop
			p.Legend.Left = f.legendTop
			p.Legend.TextStyle.Font.Size = vg.Points(8)
		}
		grid[i/cols][i%cols] = p
	}
	for i := len(reports); i < rows*cols; i++ {
		grid[i/cols][i%cols] = emptyPlot()
	}
	w, h := 11*vg.Inch, vg.Length(rows)*3*vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(100), vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(grid, tiles, dc)
	for r := range grid {
		for c := range grid[r] {
			grid[r][c].Draw(canvases[r][c])
		}
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// emptyPlot fills an unused tile.
func emptyPlot() *plot.Plot {
	p := plot.New()
	p.HideAxes()
	return p
}

// pctOf returns gib as a percentage of r's fleet memory.
func pctOf(r packing.Report, gib float64) float64 { return 100 * gib / float64(r.Fill.BoundGiB) }
