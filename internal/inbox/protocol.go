//go:build !legacy

package inbox

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/internal/sequence"
)

// ClaimProtocol names the claim semantics this engine speaks. Consumers with different claim
// protocols must never process side by side; the operator's rollout gate and the engine's
// registry fence compare it. Change it whenever the claim or release transactions change meaning.
const ClaimProtocol = "insert-first-v1"

// processUnderProtocol processes a sequenced record by this build's claim protocol: T1 with the
// claim insert first (claimAndProcess). A build with the tag legacy replaces it (legacy.go).
func (e *Engine) processUnderProtocol(ctx context.Context, conn *pgxpool.Conn, stateConn *stateConn, instanceID int64, mt *sequence.MessageType, msg Message) (Result, instanceState, error) {
	return e.claimAndProcess(ctx, conn, stateConn, instanceID, mt, msg)
}

// processBatchUnderProtocol processes a batch by this build's claim protocol: one T1 for the
// batch (processBatchInOneClaimTx).
func (e *Engine) processBatchUnderProtocol(ctx context.Context, recs []Record) ([]Result, error) {
	return e.processBatchInOneClaimTx(ctx, recs)
}
