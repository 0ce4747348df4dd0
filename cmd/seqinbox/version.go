package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/version"
	"github.com/seqinbox/seqinbox/migrations"
)

func init() {
	commands["version"] = command{summary: "print version, commit, schema version and claim protocol", run: runVersion}
}

// versionInfo is what `seqinbox version --output json` prints.
type versionInfo struct {
	Version       string `json:"version"`
	Commit        string `json:"commit"`
	SchemaVersion int    `json:"schemaVersion"`
	ClaimProtocol string `json:"claimProtocol"`
}

func runVersion(_ context.Context, args []string) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	output := fs.String("output", "text", "output format: text or json")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	info := versionInfo{Version: version.Version, Commit: version.Commit, SchemaVersion: migrations.Latest(), ClaimProtocol: inbox.ClaimProtocol}
	switch *output {
	case "json":
		return json.NewEncoder(os.Stdout).Encode(info)
	case "text":
		fmt.Printf("seqinbox %s (commit %s), schema version %d, claim protocol %s\n", info.Version, info.Commit, info.SchemaVersion, info.ClaimProtocol)
		return nil
	default:
		return fmt.Errorf("--output %q: use text or json", *output)
	}
}
