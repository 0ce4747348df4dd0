//go:build !dev

package main

import "github.com/spf13/cobra"

// devCommands is empty in the release build: the development helpers (`demo`, `dev kafka`) and
// the embedded Kafka broker they link are built only with `-tags dev` (make demo).
func devCommands() []*cobra.Command { return nil }
