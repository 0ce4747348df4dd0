// Package crd holds the generated CustomResourceDefinitions of config/crd/bases, so that a
// manifest read from a file is checked with the schema and rules the API server applies.
package crd

import _ "embed"

// SequentialInbox is the CustomResourceDefinition of SequentialInbox, as controller-gen wrote it.
//
//go:embed bases/inbox.seqinbox.dev_sequentialinboxes.yaml
var SequentialInbox []byte
