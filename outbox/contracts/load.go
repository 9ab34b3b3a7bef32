package contracts

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-cdc/outbox-cdc/outbox"
)

// Start loads the subjects once, then again every Config.Refresh in a
// goroutine until Stop or until ctx ends. It returns the first load's error;
// the goroutine runs anyway, so the checker recovers when the registry
// does (a caller that wants no writes without contracts stops and fails).
// Call it before the first write, outside any transaction.
func (c *Checker) Start(ctx context.Context) error {
	c.runMu.Lock()
	defer c.runMu.Unlock()
	if c.cancel != nil {
		return errors.New("outbox/contracts: Start called twice")
	}
	err := c.Refresh(ctx)
	ctx, c.cancel = context.WithCancel(ctx)
	c.done = make(chan struct{})
	go c.loop(ctx, c.done)
	return err
}

// Stop ends Start's goroutine and waits for it.
func (c *Checker) Stop() {
	c.runMu.Lock()
	defer c.runMu.Unlock()
	if c.cancel == nil {
		return
	}
	c.cancel()
	<-c.done
	c.cancel, c.done = nil, nil
}

func (c *Checker) loop(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(c.refresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := c.Refresh(ctx); err != nil && ctx.Err() == nil && c.onError != nil {
			c.onError(err)
		}
	}
}

// Refresh loads now the latest version of every subject the writer's events
// can name: the subject list, then each such subject's latest version (a
// version seen before is not compiled again). When the list cannot be read,
// everything of the previous load stays; when one subject cannot be read,
// its previous version stays (or it is not loaded yet). A subject gone from
// the list is gone from the checker. The error names every failure.
func (c *Checker) Refresh(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	prev := c.state.Load()
	list, err := c.cl.Subjects(ctx)
	if err != nil {
		err = fmt.Errorf("outbox/contracts: list subjects: %w", err)
		c.state.Store(&state{subjects: prev.subjects, loaded: prev.loaded, lastErr: err})
		return err
	}
	next := make(map[string]*entry, len(prev.subjects))
	var errs []error
	for _, subject := range list {
		if !c.names.mayBeOurs(subject) {
			continue
		}
		e, err := c.load(ctx, subject, prev.subjects[subject])
		if e != nil {
			next[subject] = e
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	err = errors.Join(errs...)
	c.state.Store(&state{subjects: next, loaded: true, lastErr: err})
	return err
}

// load fetches a subject's latest version. nil entry: the subject is gone
// (deleted since the listing).
func (c *Checker) load(ctx context.Context, subject string, prev *entry) (*entry, error) {
	ss, err := c.cl.SchemaByVersion(ctx, subject, -1)
	var re *sr.ResponseError
	switch {
	case errors.As(err, &re) && re.StatusCode == http.StatusNotFound && re.ErrorCode != 0:
		return nil, nil
	case err != nil:
		err = fmt.Errorf("outbox/contracts: subject %q: %w", subject, err)
		if prev != nil && prev.schema != nil {
			return prev, err // keep the version in use
		}
		return &entry{subject: subject, err: fmt.Errorf("%w: subject %q: %w (%v)", outbox.ErrNoContract, subject, ErrNotLoaded, err)}, err
	}
	key := versionKey{subject, ss.Version}
	if e := c.compiled[key]; e != nil {
		return e, e.err
	}
	e := &entry{subject: subject, version: ss.Version, id: ss.ID}
	// An answer without schemaType decodes as Avro (Apicurio leaves it
	// out): an Avro text then fails to compile as JSON Schema.
	if ss.Type != sr.TypeJSON && ss.Type != sr.TypeAvro {
		e.err = fmt.Errorf("%w: subject %q version %d is a %s schema; this checker checks JSON Schema only", ErrBadSchema, subject, ss.Version, ss.Type)
	} else if e.schema, err = CompileJSONSchema(ss.Schema.Schema); err != nil {
		e.err = fmt.Errorf("%w: subject %q version %d does not compile as JSON Schema: %w", ErrBadSchema, subject, ss.Version, err)
	}
	e.alwaysRefusable = e.err != nil
	c.compiled[key] = e
	return e, e.err
}
