package contracts

import (
	"errors"
	"net/http"
	"sync/atomic"
	"time"
)

// Observer is told what the registry client does, for metrics: the
// pipeline sets one (Contracts.SetObserver) so that this package imports
// no metrics. Its methods are called on the goroutine that made the
// request, and must not block.
type Observer interface {
	// RegistryRequest is one HTTP request to the registry and how long it
	// took, answered or not.
	RegistryRequest(d time.Duration)
	// RegistryError is a request whose answer is a *RegistryError, by
	// KindName: unreachable, no_subject, incompatible, bad_schema.
	RegistryError(kind string)
	// CacheMiss is a subject asked of the registry because no version of
	// it is in memory (its first event, or one the registry did not know).
	CacheMiss()
}

// Kind names, the values of KindName: a fixed set, usable as a metric label.
const (
	KindUnreachable  = "unreachable"
	KindNoSubject    = "no_subject"
	KindIncompatible = "incompatible"
	KindBadSchema    = "bad_schema"
)

// Kinds lists every KindName value.
func Kinds() []string {
	return []string{KindUnreachable, KindNoSubject, KindIncompatible, KindBadSchema}
}

// KindName names the kind of a *RegistryError; "" for any other error.
func KindName(err error) string {
	switch {
	case errors.Is(err, ErrUnreachable):
		return KindUnreachable
	case errors.Is(err, ErrNoSubject):
		return KindNoSubject
	case errors.Is(err, ErrIncompatible):
		return KindIncompatible
	case errors.Is(err, ErrBadSchema):
		return KindBadSchema
	}
	return ""
}

// SetObserver makes o see every registry request from now on; nil stops.
func (c *Contracts) SetObserver(o Observer) { c.reg.SetObserver(o) }

// SetObserver makes o see every registry request from now on; nil stops.
func (r *Registry) SetObserver(o Observer) {
	if o == nil {
		r.obs.Store(nil)
		return
	}
	r.obs.Store(&o)
}

// observer is the one set, or one that ignores everything.
func (r *Registry) observer() Observer {
	if o := r.obs.Load(); o != nil {
		return *o
	}
	return nopObserver{}
}

// failed tells the observer about rerr and returns it.
func (r *Registry) failed(rerr *RegistryError) *RegistryError {
	r.observer().RegistryError(KindName(rerr))
	return rerr
}

type nopObserver struct{}

func (nopObserver) RegistryRequest(time.Duration) {}
func (nopObserver) RegistryError(string)          {}
func (nopObserver) CacheMiss()                    {}

// timedTransport times every round trip for the observer.
type timedTransport struct {
	base http.RoundTripper
	obs  *atomic.Pointer[Observer]
}

func (t timedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := t.base.RoundTrip(req)
	if o := t.obs.Load(); o != nil {
		(*o).RegistryRequest(time.Since(start))
	}
	return resp, err
}
