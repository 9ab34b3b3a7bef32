package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// Redrive under load (dlq.mode quarantine): ops-redrive lifts the
// quarantine of "big" as an operator would (docs/operations.md,
// "Quarantined aggregates and redrive"): it fixes the cause (raises the big
// topic's max.message.bytes), runs `outbox-cdc redrive`, and puts the limit
// back for the next ops-oversize; the dead letter and every parked event
// must reach the big topic, in seq order.
// ops-parking-retention first lets the parking topic's retention delete
// the parked events: the redrive must refuse (exit 1, naming the deleted
// offsets and --skip) instead of skipping them silently; the suite maps the
// offsets to the events the live consumer saw there, accounts those as
// lost to retention, and lifts the quarantine with --skip; the parked
// events left must reach the topic.

// episode is a quarantine of "big" as the suite made it: the oversize event
// that began it (dead-lettered) and the events parked behind it since.
type episode struct {
	first  event
	parked []event
}

// redriveState is what the suite knows of the quarantines of "big".
type redriveState struct {
	cur *episode // nil: not quarantined
	// lifted: key → first seq of each quarantine a redrive lifted.
	lifted map[string]map[int]bool
	// lost: events parking retention deleted before a redrive, as the
	// redrive's refusal named them (event id → "partition p offset o").
	lost map[string]string
	// republished: events a redrive republished (the dead letter too,
	// unless --skip): their copies on the topic are no duplicates.
	republished map[string]bool
	// liftedAt is when the last redrive lifted a quarantine; adopted
	// counts the quarantines the suite found the connector in (syncBig).
	liftedAt time.Time
	adopted  int
}

// noteBig records events of "big" just committed: the first oversize one
// while nothing is quarantined begins a quarantine; every later one is
// parked behind it.
func (r *run) noteBig(evs []event) {
	for _, e := range evs {
		switch {
		case r.rd.cur == nil && e.Oversize:
			r.rd.cur = &episode{first: e}
		case r.rd.cur != nil:
			r.rd.cur.parked = append(r.rd.cur.parked, e)
		}
	}
}

// syncBig adopts the connector's quarantine of "big" when the suite
// knows of none: an at-least-once copy of a dead-lettered oversize event
// (a gap repair's, a runbook's verify --repair after parking retention)
// is dead-lettered again and quarantines the aggregate from that event on
// (docs/operations.md, "A lifted quarantine can come back"). Its parked
// events are the ones parked since the last lift, in parking order.
func (r *run) syncBig(ctx context.Context, kind string) {
	if r.rd.cur != nil {
		return
	}
	ls, err := r.listQuarantines(ctx)
	if err != nil {
		r.opsFailed(kind, "%v", err)
		return
	}
	i := slices.IndexFunc(ls, func(l listed) bool { return l.Key == "big" })
	if i < 0 {
		return
	}
	byID := map[string]event{}
	for _, e := range r.ledger.all() {
		if e.Agg == "big" {
			byID[e.ID] = e
		}
	}
	first, ok := byID[ls[i].FirstID]
	if !ok {
		r.opsFailed(kind, "--list shows big quarantined since %s, no committed event of big", ls[i].FirstID)
		return
	}
	ep := &episode{first: first}
	seen := map[string]bool{first.ID: true}
	for _, c := range r.live.kept(r.parkingTopic()) {
		if e, ok := byID[c.ID]; ok && !seen[c.ID] && c.Append.After(r.rd.liftedAt) {
			seen[c.ID] = true
			ep.parked = append(ep.parked, e)
		}
	}
	r.rd.cur = ep
	r.rd.adopted++
}

// ensureQuarantine runs ops-oversize when "big" is not quarantined.
func (r *run) ensureQuarantine(ctx context.Context, kind string) (string, error) {
	if r.rd.cur != nil {
		return fmt.Sprintf("big quarantined since seq %d", r.rd.cur.first.Seq), nil
	}
	if r.syncBig(ctx, kind); r.rd.cur != nil {
		return fmt.Sprintf("big quarantined again since seq %d by a copy of its dead letter (found with --list; %d parked since the last lift)",
			r.rd.cur.first.Seq, len(r.rd.cur.parked)), nil
	}
	d, err := r.opsOversize(ctx)
	return "ops-oversize first: " + d, err
}

// awaitOn waits until every event of evs has a copy on topic (the live
// consumer's), for up to d; it returns the ones without.
func (r *run) awaitOn(ctx context.Context, topic string, evs []event, d time.Duration) []event {
	deadline := time.Now().Add(d)
	for {
		var missing []event
		for _, e := range evs {
			if len(r.live.copiesOf(topic, e.ID)) == 0 {
				missing = append(missing, e)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) || !sleepCtx(ctx, 50*time.Millisecond) { // poll of the live consumer
			return missing
		}
	}
}

// redrive runs `outbox-cdc redrive` with the connector's configuration;
// it returns the exit code and the output.
func (r *run) redrive(ctx context.Context, args ...string) (int, string) {
	cmd, cancel := r.redriveCmd(ctx, args...)
	defer cancel()
	return exitOf(cmd.CombinedOutput())
}

// redriveCmd is `outbox-cdc redrive args` with the connector's
// configuration, bounded at three minutes.
func (r *run) redriveCmd(ctx context.Context, args ...string) (*exec.Cmd, context.CancelFunc) {
	rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	cmd := exec.CommandContext(rctx, r.conn.bin, append([]string{"redrive", "--config", r.conn.cfgPath}, args...)...)
	cmd.Env = cleanEnv()
	return cmd, cancel
}

// exitOf is a command's exit code and output.
func exitOf(out []byte, err error) (int, string) {
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	case err != nil:
		return -1, string(out) + err.Error()
	}
	return 0, string(out)
}

// listed is one quarantine as `redrive --list --json` prints it.
type listed struct {
	State   string `json:"state"`
	Key     string `json:"key"`
	FirstID string `json:"first_id"`
}

// listQuarantines reads the JSON on the standard output only: the log
// (the configuration's warnings among it) goes to the standard error.
func (r *run) listQuarantines(ctx context.Context) ([]listed, error) {
	cmd, cancel := r.redriveCmd(ctx, "--list", "--json")
	defer cancel()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	code, out := exitOf(cmd.Output())
	var ls []listed
	if code != 0 {
		return nil, fmt.Errorf("redrive --list --json: exit %d: %s%s", code, out, stderr.String())
	}
	if err := json.Unmarshal([]byte(out), &ls); err != nil {
		return nil, fmt.Errorf("redrive --list --json: %w: %s", err, out)
	}
	return ls, nil
}

// lift redrives the current quarantine (with --skip, or with the dead
// letter) and checks that the events of want reach the big topic, their
// first copies in seq order. kind names the fault for its failures.
func (r *run) lift(ctx context.Context, kind string, skip bool, want []event) string {
	ep := r.rd.cur
	args, how := []string{"--aggregate", "big", "--wait", "2m"}, "redrive"
	if skip {
		args, how = append(args, "--skip"), "redrive --skip"
	}
	code, out := r.redrive(ctx, args...)
	if code != 0 || !strings.Contains(out, "quarantine lifted") {
		r.opsFailed(kind, "%s: exit %d, want 0 and \"quarantine lifted\":\n%s", how, code, out)
		return fmt.Sprintf("; %s exit %d", how, code)
	}
	r.noteLifted(ep, want)
	missing := r.awaitOn(ctx, r.bigTopic, want, time.Minute)
	if len(missing) > 0 {
		r.opsFailed(kind, "%d of %d events not on %s within 1m of the %s; first: %s seq %d", len(missing), len(want), r.bigTopic, how, missing[0].ID, missing[0].Seq)
		return fmt.Sprintf("; %s lifted it, %d of %d events NOT republished", how, len(missing), len(want))
	}
	seqs := r.firstSeqsOn(r.bigTopic, want)
	if !slices.IsSorted(seqs) {
		r.opsFailed(kind, "events republished out of order: seqs %v", seqs)
	}
	return fmt.Sprintf("; %s lifted it, %d events republished (seqs %v), 0 lost", how, len(want), seqs)
}

// noteLifted records that a redrive lifted ep, republishing want.
func (r *run) noteLifted(ep *episode, want []event) {
	if r.rd.lifted == nil {
		r.rd.lifted = map[string]map[int]bool{}
	}
	if r.rd.lifted[ep.first.Agg] == nil {
		r.rd.lifted[ep.first.Agg] = map[int]bool{}
	}
	r.rd.lifted[ep.first.Agg][ep.first.Seq] = true
	r.rd.cur, r.rd.liftedAt = nil, time.Now()
	if r.rd.republished == nil {
		r.rd.republished = map[string]bool{}
	}
	for _, e := range want {
		r.rd.republished[e.ID] = true
	}
}

// firstSeqsOn is the seq of the first copy on topic of each event of evs,
// in the order the live consumer read them.
func (r *run) firstSeqsOn(topic string, evs []event) []int {
	want := map[string]int{}
	for _, e := range evs {
		want[e.ID] = e.Seq
	}
	var seqs []int
	for _, c := range r.live.kept(topic) {
		if s, ok := want[c.ID]; ok {
			seqs = append(seqs, s)
			delete(want, c.ID)
		}
	}
	return seqs
}

// parkedQuarantine makes sure "big" is quarantined (ops-oversize first if
// not) and waits for its parked events; kind names the fault for failures.
func (r *run) parkedQuarantine(ctx context.Context, kind string) (*episode, string, error) {
	desc, err := r.ensureQuarantine(ctx, kind)
	if err != nil {
		return nil, desc, err
	}
	ep := r.rd.cur
	if ep == nil {
		return nil, desc, errors.New("big is not quarantined after ops-oversize")
	}
	if missing := r.awaitOn(ctx, r.parkingTopic(), ep.parked, 30*time.Second); len(missing) > 0 {
		r.opsFailed(kind, "%d of %d events of big not parked within 30s", len(missing), len(ep.parked))
	}
	return ep, desc, nil
}

// opsRedrive quarantines "big" if it is not, waits for its parked events,
// raises the big topic's limit (the fix of an oversize event) and lifts the
// quarantine with a redrive: nothing deleted, the dead letter and every
// parked event republished in order. The limit is put back after.
func (r *run) opsRedrive(ctx context.Context) (string, error) {
	ep, desc, err := r.parkedQuarantine(ctx, fOpsRedrive)
	if err != nil {
		return desc, err
	}
	desc += fmt.Sprintf("; %d parked", len(ep.parked))
	if err := r.setBigLimit(ctx, 1<<20); err != nil {
		return desc, err
	}
	desc += r.lift(ctx, fOpsRedrive, false, append([]event{ep.first}, ep.parked...))
	return desc, r.setBigLimit(ctx, bigTopicMaxBytes)
}

// setBigLimit sets the big topic's max.message.bytes.
func (r *run) setBigLimit(ctx context.Context, n int) error {
	cl, err := newKafkaClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	actx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return alterTopic(actx, kadm.NewClient(cl), r.bigTopic, kadm.AlterConfig{Op: kadm.SetConfig, Name: "max.message.bytes", Value: kadm.StringPtr(strconv.Itoa(n))})
}

// goneRange is what a redrive's refusal names: "partition P offsets A-B".
var goneRange = regexp.MustCompile(`partition (\d+) offsets (\d+)-(\d+)`)

// opsParkingRetention quarantines "big" if it is not, lets the parking
// topic's retention delete what is parked (retention.ms 1 until the log
// start passed the parked records, then back), parks two more events, and
// redrives with the cause fixed (the big topic's limit raised): the redrive
// must refuse naming the deleted offsets; those events are accounted lost
// to retention; --skip then lifts the quarantine and the two parked after
// the deletion must reach the topic.
func (r *run) opsParkingRetention(ctx context.Context) (_ string, err error) {
	ep, desc, err := r.parkedQuarantine(ctx, fOpsParkingRetention)
	if err != nil {
		return desc, err
	}
	deleted := slices.Clone(ep.parked)
	// Parked copies of events a redrive delivered before (an adopted
	// quarantine, syncBig) are on the topic already.
	fresh := slices.DeleteFunc(slices.Clone(ep.parked), func(e event) bool { return len(r.live.copiesOf(r.bigTopic, e.ID)) > 0 })
	start, took, err := r.expireParking(ctx)
	if err != nil {
		return desc, err
	}
	desc += fmt.Sprintf("; retention.ms 1 moved the parking log start to %d in %v (%d parked events)", start, took.Round(time.Millisecond), len(deleted))

	// Two more, parked behind the deleted ones: they survive.
	mark := len(ep.parked)
	if err := r.commitBig(ctx, 2); err != nil {
		return desc, err
	}
	kept := slices.Clone(ep.parked[mark:])
	if missing := r.awaitOn(ctx, r.parkingTopic(), kept, 30*time.Second); len(missing) > 0 {
		r.opsFailed(fOpsParkingRetention, "%d of %d events of big not parked within 30s", len(missing), len(kept))
	}

	// The operator fixed the cause first: only the deletion stands in the
	// way of the redrive. The limit goes back once the quarantine is lifted.
	if err := r.setBigLimit(ctx, 1<<20); err != nil {
		return desc, err
	}
	defer func() {
		if e := r.setBigLimit(ctx, bigTopicMaxBytes); e != nil && err == nil {
			err = e
		}
	}()
	code, out := r.redrive(ctx, "--aggregate", "big", "--wait", "2m")
	if code != 1 || !strings.Contains(out, "were deleted") || !strings.Contains(out, "--skip") {
		r.opsFailed(fOpsParkingRetention, "redrive with parked events deleted: exit %d, want 1 naming the deleted offsets and --skip:\n%s", code, out)
		if code == 0 { // it lifted the quarantine: whatever it skipped is lost, silently
			r.noteLifted(ep, append([]event{ep.first}, kept...))
		}
		return desc + fmt.Sprintf("; redrive exit %d (NOT refused)", code), nil
	}
	named, err := r.namedLost(out)
	if err != nil {
		r.opsFailed(fOpsParkingRetention, "%v", err)
	}
	// The deleted range may also hold the quarantine's first event (parked
	// behind its dead letter, which the redrive would republish), and a
	// parked copy of an event a redrive of an earlier episode delivered:
	// naming them is no mismatch (two fresh-clone short runs, seeds
	// 13259229869989021183 twice, named the first).
	check := maps.Clone(named)
	for id := range check {
		if id == ep.first.ID || !slices.ContainsFunc(deleted, func(e event) bool { return e.ID == id }) &&
			len(r.live.copiesOf(r.bigTopic, id)) > 0 {
			delete(check, id)
		}
	}
	if d := lostMismatch(check, deleted); d != "" {
		r.opsFailed(fOpsParkingRetention, "the refusal names other events than retention deleted: %s\n%s", d, out)
	}
	if r.rd.lost == nil {
		r.rd.lost = map[string]string{}
	}
	for id, at := range named {
		// A parked copy of an event a redrive delivered before (the
		// quarantine is a copy's, syncBig) is no loss; nor is the first
		// event, whose dead letter verify finds.
		if id != ep.first.ID && len(r.live.copiesOf(r.bigTopic, id)) == 0 {
			r.rd.lost[id] = at
		}
	}
	desc += fmt.Sprintf("; redrive refused (exit 1) naming %d deleted events", len(named))
	ls, err := r.listQuarantines(ctx)
	if err != nil {
		r.opsFailed(fOpsParkingRetention, "%v", err)
	} else if i := slices.IndexFunc(ls, func(l listed) bool { return l.Key == "big" }); i < 0 || ls[i].FirstID != ep.first.ID {
		r.opsFailed(fOpsParkingRetention, "after the refusal --list shows %+v, want big quarantined since event %s", ls, ep.first.ID)
	}
	if got := r.firstSeqsOn(r.bigTopic, append(fresh, ep.parked[mark:]...)); len(got) != 0 {
		r.opsFailed(fOpsParkingRetention, "the refused redrive republished seqs %v", got)
	}
	// The way out the refusal names: --skip, without the deleted events and
	// without the dead letter.
	return desc + r.lift(ctx, fOpsParkingRetention, true, kept), nil
}

// commitBig commits n events of "big" that fit its topic.
func (r *run) commitBig(ctx context.Context, n int) error {
	pad := r.big.pad
	r.big.pad = 0
	defer func() { r.big.pad = pad }()
	for range n {
		evs, err := r.big.commitNext(ctx)
		if err != nil {
			return err
		}
		r.noteBig(evs)
	}
	return nil
}

// expireParking sets the parking topic's retention.ms to 1 until its log
// start reaches its end (the broker checks retention every second here,
// log.retention.check.interval.ms), then restores the setting. It returns
// the new log start.
func (r *run) expireParking(ctx context.Context) (int64, time.Duration, error) {
	cl, err := newKafkaClient()
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topic := r.parkingTopic()
	// Seen: 9 to 26 s for the log start to move on a loaded machine.
	actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	ends, err := adm.ListEndOffsets(actx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return 0, 0, fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	end, _ := ends.Lookup(topic, 0)
	began := time.Now()
	if err := alterTopic(actx, adm, topic, kadm.AlterConfig{Op: kadm.SetConfig, Name: "retention.ms", Value: kadm.StringPtr("1")}); err != nil {
		return 0, 0, err
	}
	var start int64
	for {
		starts, err := adm.ListStartOffsets(actx, topic)
		if err == nil {
			if o, ok := starts.Lookup(topic, 0); ok && o.Err == nil {
				start = o.Offset
			}
		}
		if start >= end.Offset || !sleepCtx(actx, 100*time.Millisecond) { // poll of the log start
			break
		}
	}
	took := time.Since(began)
	// The suite created the topic without a retention.ms of its own.
	if err := alterTopic(ctx, adm, topic, kadm.AlterConfig{Op: kadm.DeleteConfig, Name: "retention.ms"}); err != nil {
		return start, took, err
	}
	if start < end.Offset {
		return start, took, fmt.Errorf("the parking log start is %d after %v, not past the parked records (end %d)", start, took, end.Offset)
	}
	return start, took, nil
}

func alterTopic(ctx context.Context, adm *kadm.Client, topic string, c kadm.AlterConfig) error {
	resps, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{c}, topic)
	if err == nil {
		_, err = resps.On(topic, func(r *kadm.AlterConfigsResponse) error { return r.Err })
	}
	if err != nil {
		return fmt.Errorf("alter %s of %s: %w", c.Name, topic, err)
	}
	return nil
}

// namedLost maps the offsets a refusal names to the events the live
// consumer read there.
func (r *run) namedLost(out string) (map[string]string, error) {
	ms := goneRange.FindAllStringSubmatch(out, -1)
	if len(ms) == 0 {
		return nil, fmt.Errorf("the refusal names no \"partition P offsets A-B\":\n%s", out)
	}
	at := map[[2]int64]string{}
	for _, c := range r.live.kept(r.parkingTopic()) {
		at[[2]int64{int64(c.Partition), c.Offset}] = c.ID
	}
	named := map[string]string{}
	var unknown []string
	for _, m := range ms {
		p, _ := strconv.ParseInt(m[1], 10, 32)
		from, _ := strconv.ParseInt(m[2], 10, 64)
		to, _ := strconv.ParseInt(m[3], 10, 64)
		for o := from; o <= to; o++ {
			id, ok := at[[2]int64{p, o}]
			if !ok {
				unknown = append(unknown, fmt.Sprintf("%d@%d", p, o))
				continue
			}
			named[id] = fmt.Sprintf("partition %d offset %d", p, o)
		}
	}
	// In exactly_once the deleted offsets hold transaction markers and the
	// records of aborted attempts too, which read_committed never returns;
	// the events named are still compared with those deleted (lostMismatch).
	if len(unknown) > 0 && !exactlyOnce() {
		return named, fmt.Errorf("the refusal names parking offsets the live consumer never read: %s", strings.Join(unknown, ", "))
	}
	return named, nil
}

// lostMismatch compares the events a refusal named with those retention
// deleted; "" when they are the same.
func lostMismatch(named map[string]string, deleted []event) string {
	var extra, missing []string
	want := map[string]bool{}
	for _, e := range deleted {
		want[e.ID] = true
		if named[e.ID] == "" {
			missing = append(missing, fmt.Sprintf("%s (seq %d)", e.ID, e.Seq))
		}
	}
	for id := range named {
		if !want[id] {
			extra = append(extra, id)
		}
	}
	if len(extra) == 0 && len(missing) == 0 {
		return ""
	}
	slices.Sort(extra)
	return fmt.Sprintf("not named: %v; named but not deleted parked events of the quarantine: %v", missing, extra)
}
