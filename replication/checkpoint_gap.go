package replication

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// gapRepaired is the gap_repaired column: what earlier repairs of the gap
// read and the transactions they leave out (offsets.Gap; since and xmin
// have columns of their own).
type gapRepaired struct {
	// An older version's save leaves this column as it was, and may save
	// the same gap (a merge can give back since and xmin): SavedAt is the
	// save's updated_at (gapRepairedSQL), and a start ignores the column
	// when the row's differs, or since or xmin do.
	SavedAt  time.Time             `json:"saved_at"`
	Since    lsn.LSN               `json:"since"`
	Xmin     uint64                `json:"xmin"`
	Repaired offsets.RepairedRows  `json:"repaired,omitzero"`
	Pending  offsets.PendingRepair `json:"pending,omitzero"`
	LookUp   bool                  `json:"look_up,omitempty"`
	Finished offsets.FinishedTxns  `json:"finished,omitzero"`
}

// gapRepairedSQL is the column's value in the save ($16: the JSON, or
// NULL), stamped with the statement's now(), which updated_at gets too.
const gapRepairedSQL = `CASE WHEN $16::text IS NULL THEN NULL ELSE jsonb_set($16::jsonb, '{saved_at}', to_jsonb(now()))::text END`

// encodeGapRepaired is the column's value for g: NULL when no repair is
// recorded.
func encodeGapRepaired(g *offsets.Gap) (any, error) {
	if g.Repaired.IsZero() && g.Pending == (offsets.PendingRepair{}) && !g.LookUp && g.Finished.IsZero() {
		return nil, nil
	}
	b, err := json.Marshal(gapRepaired{Since: g.Since, Xmin: g.Xmin, Repaired: g.Repaired, Pending: g.Pending, LookUp: g.LookUp,
		Finished: g.Finished})
	if err != nil {
		return nil, fmt.Errorf("gap_repaired: %w", err)
	}
	return string(b), nil
}

// decodeGapRepaired sets g's repairs from the column's text ("" for NULL)
// of the row saved at savedAt. Ignored, the gap is read whole: copies at
// worst.
func decodeGapRepaired(text string, savedAt time.Time, g *offsets.Gap) error {
	if text == "" {
		return nil
	}
	var r gapRepaired
	if err := json.Unmarshal([]byte(text), &r); err != nil {
		return fmt.Errorf("gap_repaired: %w", err)
	}
	if !r.SavedAt.Equal(savedAt) || r.Since != g.Since || r.Xmin != g.Xmin {
		return nil // another save's, left by an older version
	}
	g.Repaired, g.Pending, g.LookUp, g.Finished = r.Repaired, r.Pending, r.LookUp, r.Finished
	return nil
}
