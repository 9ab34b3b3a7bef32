package pipeline

import (
	"encoding/json"
	"sync"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// maxIgnoredPrefixes bounds the prefix label of the ignored-messages metric:
// the prefixes come from any application writing to the database.
const maxIgnoredPrefixes = 32

// otherPrefixes is the label of the prefixes beyond maxIgnoredPrefixes.
const otherPrefixes = "(other)"

// ignoredMessages remembers the prefixes of the logical messages the
// pipeline saw and did not publish. A table-less event emitted with a prefix
// other than outbox.message_prefix (a typo, a Writer left at the default) is
// otherwise dropped without a trace, and verify, which reads the outbox
// table, cannot find it either.
type ignoredMessages struct {
	mu     sync.Mutex
	seen   map[string]bool // prefixes counted under their own label
	warned map[string]bool // prefixes already warned about
}

// publishable reports whether msg is a table-less outbox event to publish:
// transactional, with outbox.message_prefix. Any other is ignored and
// counted (ignoreMessage).
func (w *processor) publishable(msg *decode.Message) bool {
	p := w.p
	if p.cfg.MessagePrefix != "" && msg.Transactional && msg.Prefix == p.cfg.MessagePrefix {
		return true
	}
	w.ignoreMessage(msg)
	return false
}

// ignoreMessage counts msg, which is not published, by prefix, and warns
// once per prefix whose content is an outbox event (the wire format Emit
// writes): that is an event lost to a configuration mistake, not another
// application's message.
func (w *processor) ignoreMessage(msg *decode.Message) {
	p := w.p
	im := &w.ignored
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.seen == nil {
		im.seen, im.warned = map[string]bool{}, map[string]bool{}
	}
	label := msg.Prefix
	if !im.seen[label] {
		if len(im.seen) >= maxIgnoredPrefixes {
			label = otherPrefixes
		} else {
			im.seen[label] = true
		}
	}
	p.m.MessagesIgnored.WithLabelValues(label).Inc()
	if im.warned[msg.Prefix] || len(im.warned) >= maxIgnoredPrefixes || !looksLikeOutboxEvent(msg.Content) {
		return
	}
	im.warned[msg.Prefix] = true
	why := "its prefix is not outbox.message_prefix"
	if msg.Prefix == p.cfg.MessagePrefix {
		why = "it is not transactional (pg_logical_emit_message(false, …)), so it is not part of a transaction"
	}
	p.log.Warn("a logical decoding message carries an outbox event but is not published: "+why+
		" (counted in outbox_cdc_logical_messages_ignored_total; warned once per prefix)",
		"prefix", msg.Prefix, "message_prefix", p.cfg.MessagePrefix, "lsn", msg.LSN)
}

// looksLikeOutboxEvent reports whether content is a JSON object with the
// members outbox.Writer.Emit always writes.
func looksLikeOutboxEvent(content []byte) bool {
	var m wire.Message
	if json.Unmarshal(content, &m) != nil {
		return false
	}
	return m.ID != nil && m.AggregateType != nil && m.AggregateID != nil && m.EventType != nil
}
