package sink

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
)

// TestRetryLost: a listing that fails for a lost connection or a
// retriable broker error is tried again; any other error, and success,
// end it at once.
func TestRetryLost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reset := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}
	denied := kerr.TopicAuthorizationFailed
	for _, tt := range []struct {
		name  string
		errs  []error // the answers, in turn; nil after them
		calls int
		want  error
	}{
		{"at once", nil, 1, nil},
		{"a lost connection, then an answer", []error{reset, reset}, 3, nil},
		{"a retriable broker error, then an answer", []error{kerr.NotLeaderForPartition}, 2, nil},
		{"refused", []error{denied, nil}, 1, denied},
	} {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			err := retryLost(ctx, func() error {
				calls++
				if calls <= len(tt.errs) {
					return tt.errs[calls-1]
				}
				return nil
			})
			if !errors.Is(err, tt.want) || err != nil && tt.want == nil || calls != tt.calls {
				t.Fatalf("err %v after %d calls, want %v after %d", err, calls, tt.want, tt.calls)
			}
		})
	}
}
