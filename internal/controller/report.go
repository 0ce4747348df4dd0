package controller

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/seqinbox/seqinbox/migrations"
)

// parseReport decodes the report that `seqinbox migrate --output json` wrote to the termination
// message of a successful Job (docs/design.md#command-line); a report without claim protocol or
// engine version is not one.
func parseReport(message string) (*migrations.Report, error) {
	var r migrations.Report
	if err := json.Unmarshal([]byte(message), &r); err != nil {
		return nil, fmt.Errorf("decode migrate report: %w", err)
	}
	if r.ClaimProtocol == "" || r.EngineVersion == "" {
		return nil, fmt.Errorf("migrate report without claimProtocol or engineVersion: %.200q", message)
	}
	return &r, nil
}

// failureDetail is what a failed container's termination message says: the report's error when
// `seqinbox migrate` wrote one, else the message itself (the log tail).
func failureDetail(message string) string {
	var r migrations.Report
	if err := json.Unmarshal([]byte(message), &r); err == nil && r.Error != "" {
		return r.Error
	}
	return strings.TrimSpace(message)
}
