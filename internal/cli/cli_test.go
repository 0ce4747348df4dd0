package cli

import (
	"bytes"
	"context"
	"testing"

	"github.com/spf13/cobra"
)

// A command that ran elsewhere (in a pod) and printed its own error ends the process with that
// command's exit code and nothing more on stderr.
func TestExitedPassesTheCodeOnWithoutASecondMessage(t *testing.T) {
	for _, code := range []int{ExitOK, ExitFailed, ExitUsage, 3} {
		root := &cobra.Command{Use: "tool", SilenceErrors: true, SilenceUsage: true,
			RunE: func(*cobra.Command, []string) error { return Exited(code) }}
		var out, errOut bytes.Buffer
		err := Run(context.Background(), root, nil, &out, &errOut)
		if err != nil {
			PrintError(&errOut, err)
		}
		if got := ExitCode(err); got != code {
			t.Errorf("Exited(%d): exit code %d", code, got)
		}
		if code != ExitOK && errOut.Len() > 0 {
			t.Errorf("Exited(%d) printed %q", code, errOut.String())
		}
	}
}
