package plugin

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/internal/cli"
)

// Output formats of -o/--output; the text screen is the default.
const (
	outputText = ""
	outputJSON = "json"
	outputYAML = "yaml"
)

// addOutputFlag binds -o/--output (json or yaml; unset: the text screen) as kubectl spells it.
func addOutputFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVarP(p, "output", "o", outputText, "output format: json or yaml (default: the text screen)")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{outputJSON, outputYAML}, cobra.ShellCompDirectiveNoFileComp))
}

// checkOutput returns a usage error for an --output value other than json or yaml.
func checkOutput(output string) error {
	switch output {
	case outputText, outputJSON, outputYAML:
		return nil
	}
	return cli.UsageErrorf("--output %q: use json or yaml, or leave it out for the text screen", output)
}

// printData writes v as JSON or YAML.
func printData(w io.Writer, output string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", output, err)
	}
	if output == outputYAML {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return fmt.Errorf("encode yaml: %w", err)
		}
		_, err = w.Write(b)
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// screen is how text is written to a writer: with colours and cut to the width of a terminal,
// plain and whole when the output is piped (or NO_COLOR is set, for colours).
type screen struct {
	colour bool
	// width is the terminal's columns; 0 when the output is no terminal (nothing is cut).
	width int
}

// screenOf looks at w: a terminal gets colours and its width, anything else plain text.
func screenOf(w io.Writer) screen {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return screen{}
	}
	s := screen{colour: os.Getenv("NO_COLOR") == ""}
	if width, _, err := term.GetSize(int(f.Fd())); err == nil && width > 0 {
		s.width = width
	}
	return s
}

// Colours of the text screen (ANSI SGR).
const (
	colourRed    = "31"
	colourGreen  = "32"
	colourYellow = "33"
	colourBold   = "1"
)

// paint colours s when the screen has colours.
func (s screen) paint(code, text string) string {
	if !s.colour || text == "" {
		return text
	}
	return "\x1b[" + code + "m" + text + "\x1b[0m"
}

// cut shortens text to n columns with an ellipsis; n <= 0 keeps it whole.
func cut(text string, n int) string {
	if n <= 0 || utf8.RuneCountInString(text) <= n {
		return text
	}
	if n == 1 {
		return "…"
	}
	r := []rune(text)
	return strings.TrimRight(string(r[:n-1]), " ") + "…"
}

// cell is one value of a table row and its colour ("" for none).
type cell struct {
	text, colour string
}

// table writes rows with aligned columns, each indented by indent; the last column is cut to what
// the screen's width leaves (colour codes are added after padding, so they never shift a column).
func (s screen) table(w io.Writer, indent string, rows [][]cell) {
	var widths []int
	for _, row := range rows {
		for i, c := range row[:len(row)-1] {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(c.text))
		}
	}
	for _, row := range rows {
		var b strings.Builder
		b.WriteString(indent)
		used := len(indent)
		for i, c := range row {
			text := c.text
			if i == len(row)-1 {
				if s.width > 0 {
					text = cut(text, max(s.width-used, 1))
				}
				b.WriteString(s.paint(c.colour, text))
				break
			}
			b.WriteString(s.paint(c.colour, text))
			pad := widths[i] - utf8.RuneCountInString(text) + 2
			b.WriteString(strings.Repeat(" ", pad))
			used += widths[i] + 2
		}
		_, _ = fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// line writes one line, cut to the screen's width.
func (s screen) line(w io.Writer, text string) {
	_, _ = fmt.Fprintln(w, cut(text, s.width))
}
