package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/version"
	"github.com/seqinbox/seqinbox/migrations"
)

// versionInfo is what `seqinbox version --output json` prints.
type versionInfo struct {
	Version       string `json:"version"`
	Commit        string `json:"commit"`
	SchemaVersion int    `json:"schemaVersion"`
	ClaimProtocol string `json:"claimProtocol"`
}

func buildInfo() versionInfo {
	return versionInfo{Version: version.Version, Commit: version.Commit, SchemaVersion: migrations.Latest(), ClaimProtocol: inbox.ClaimProtocol}
}

// versionLine is the build in one line, after the program name; `seqinbox version` and
// `seqinbox --version` print it.
func versionLine() string {
	info := buildInfo()
	return fmt.Sprintf("%s (commit %s), schema version %d, claim protocol %s", info.Version, info.Commit, info.SchemaVersion, info.ClaimProtocol)
}

func newVersionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print version, commit, schema version and claim protocol",
		Long: `Print the release and commit of this build, the schema version its migrations reach, and the
claim protocol its engine speaks. Consumers of different claim protocols never process side by
side; the operator compares them before a rollout.`,
		Example: `  seqinbox version
  seqinbox version -o json`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if output == outputJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(buildInfo())
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), "seqinbox "+versionLine())
			return err
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}
