package replication

import (
	"encoding/json"
	"fmt"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// gapRepaired is the gap_repaired column: what earlier repairs of the gap
// read (offsets.Gap; since and xmin have columns of their own).
type gapRepaired struct {
	// Since and Xmin are the gap's: an older version that saves the gap
	// leaves this column as it was, and a start then ignores it.
	Since    lsn.LSN               `json:"since"`
	Xmin     uint64                `json:"xmin"`
	Repaired offsets.RepairedRows  `json:"repaired,omitzero"`
	Pending  offsets.PendingRepair `json:"pending,omitzero"`
	LookUp   bool                  `json:"look_up,omitempty"`
}

// encodeGapRepaired is the column's value for g: NULL when no repair is
// recorded.
func encodeGapRepaired(g *offsets.Gap) (any, error) {
	if g.Repaired.IsZero() && g.Pending == (offsets.PendingRepair{}) && !g.LookUp {
		return nil, nil
	}
	b, err := json.Marshal(gapRepaired{Since: g.Since, Xmin: g.Xmin, Repaired: g.Repaired, Pending: g.Pending, LookUp: g.LookUp})
	if err != nil {
		return nil, fmt.Errorf("gap_repaired: %w", err)
	}
	return string(b), nil
}

// decodeGapRepaired sets g's repairs from the column's text ("" for NULL).
func decodeGapRepaired(text string, g *offsets.Gap) error {
	if text == "" {
		return nil
	}
	var r gapRepaired
	if err := json.Unmarshal([]byte(text), &r); err != nil {
		return fmt.Errorf("gap_repaired: %w", err)
	}
	if r.Since != g.Since || r.Xmin != g.Xmin {
		return nil // another gap's, left by an older version: read the gap whole (copies at worst)
	}
	g.Repaired, g.Pending, g.LookUp = r.Repaired, r.Pending, r.LookUp
	return nil
}
