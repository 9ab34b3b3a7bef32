package minimal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Config configures Run.
type Config struct {
	DSN         string // PostgreSQL connection string; Run adds replication=database
	Slot        string // an existing pgoutput slot
	Publication string
	Brokers     []string
	TopicPrefix string        // a record's topic is TopicPrefix + its aggregate_type
	Linger      time.Duration // kgo.ProducerLinger; everything else is franz-go's default
	// Status is how often the confirmable position is reported to the slot.
	Status time.Duration
	// Grace bounds, after a stop, the wait for records already produced.
	Grace time.Duration
	// StopAfter > 0 makes Run return once that many events are confirmed
	// (the benchmark's drain, like pg_recvlogical's --endpos).
	StopAfter int64
}

// Validate names the first field that cannot work.
func (c Config) Validate() error {
	switch {
	case c.DSN == "":
		return errors.New("minimal: DSN is empty")
	case c.Slot == "":
		return errors.New("minimal: Slot is empty")
	case c.Publication == "":
		return errors.New("minimal: Publication is empty")
	case len(c.Brokers) == 0:
		return errors.New("minimal: no Brokers")
	case c.Status <= 0:
		return fmt.Errorf("minimal: Status %v must be positive", c.Status)
	case c.Grace <= 0:
		return fmt.Errorf("minimal: Grace %v must be positive", c.Grace)
	case c.Linger < 0 || c.StopAfter < 0:
		return fmt.Errorf("minimal: Linger %v and StopAfter %d must not be negative", c.Linger, c.StopAfter)
	}
	return nil
}

// stream is the one goroutine that owns the replication connection.
type stream struct {
	cfg  Config
	conn *pgconn.PgConn
	cl   *kgo.Client
	pctx context.Context // records are produced with it: it outlives a stop by Grace
	tr   *Tracker
	dec  *decoder
	log  *slog.Logger

	txn    *Txn      // the open transaction, nil between COMMIT and BEGIN
	commit time.Time // its commit time, every record's timestamp
}

// Run streams the slot into Kafka until ctx is done, StopAfter events are
// confirmed, or an error; then it flushes the producer and confirms what
// Kafka acknowledged. A stop by ctx returns nil.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	// Buffered records fail when the context they were produced with ends,
	// so they get one that ends Grace after ctx, or when Run returns.
	pctx, pcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer pcancel()
	// A grace timer left running past Run only cancels a finished context.
	stopGrace := context.AfterFunc(ctx, func() { time.AfterFunc(cfg.Grace, pcancel) })
	defer stopGrace()

	cl, err := kgo.NewClient(kgo.SeedBrokers(cfg.Brokers...), kgo.ProducerLinger(cfg.Linger))
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	conn, err := connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	s := &stream{cfg: cfg, conn: conn, cl: cl, pctx: pctx, tr: NewTracker(cfg.StopAfter), dec: newDecoder(cfg.TopicPrefix), log: log}
	log.Info("streaming", "slot", cfg.Slot, "publication", cfg.Publication, "linger", cfg.Linger)
	return s.finish(s.read(ctx))
}

// connect opens a replication connection and starts streaming the slot from
// its confirmed position.
func connect(ctx context.Context, cfg Config) (*pgconn.PgConn, error) {
	pc, err := pgconn.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("dsn: %w", err)
	}
	pc.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	args := []string{"proto_version '1'", fmt.Sprintf("publication_names '%s'", cfg.Publication)}
	err = pglogrepl.StartReplication(ctx, conn, cfg.Slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: args})
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("start replication on %s: %w", cfg.Slot, err)
	}
	return conn, nil
}

// read receives until ctx is done or the goal is reached (nil) or an error.
// Waits use the socket's read deadline, not a context per message: pgconn
// starts a goroutine for every receive under a cancelable context.
func (s *stream) read(ctx context.Context) error {
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { // ends with rctx
		select {
		case <-s.tr.Reached():
			stop()
		case <-rctx.Done():
		}
	}()
	nc := s.conn.Conn()
	wake := context.AfterFunc(rctx, func() { _ = nc.SetReadDeadline(time.Now()) })
	defer wake()
	defer func() { _ = nc.SetReadDeadline(time.Time{}) }()
	next := time.Now().Add(s.cfg.Status)
	_ = nc.SetReadDeadline(next)
	for {
		// After the deadline is set: a wake before it is seen here.
		if rctx.Err() != nil {
			return nil
		}
		if !time.Now().Before(next) {
			if err := s.status(); err != nil {
				return err
			}
			next = time.Now().Add(s.cfg.Status)
			_ = nc.SetReadDeadline(next)
			continue
		}
		msg, err := s.conn.ReceiveMessage(context.Background())
		switch {
		case err != nil && pgconn.Timeout(err):
			continue
		case err != nil:
			return fmt.Errorf("receive: %w", err)
		}
		if err := s.message(msg); err != nil {
			return err
		}
	}
}

// message handles one message of the COPY BOTH stream.
func (s *stream) message(msg pgproto3.BackendMessage) error {
	switch m := msg.(type) {
	case *pgproto3.CopyData:
		return s.copyData(m.Data)
	case *pgproto3.ErrorResponse:
		return fmt.Errorf("replication: %w", pgconn.ErrorResponseToPgError(m))
	default:
		return fmt.Errorf("replication: unexpected %T", msg)
	}
}

// copyData handles a keepalive or a WAL message.
func (s *stream) copyData(data []byte) error {
	if len(data) == 0 {
		return errors.New("replication: empty CopyData")
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("keepalive: %w", err)
		}
		if k.ReplyRequested {
			return s.status()
		}
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("xlogdata: %w", err)
		}
		m, err := pglogrepl.Parse(x.WALData)
		if err != nil {
			return fmt.Errorf("pgoutput at %s: %w", x.WALStart, err)
		}
		return s.logical(m)
	}
	return nil
}

// logical handles one pgoutput message. The publication publishes inserts
// only; type, origin and the other messages carry nothing to deliver.
func (s *stream) logical(m pglogrepl.Message) error {
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		return s.dec.relation(m)
	case *pglogrepl.BeginMessage:
		if s.txn != nil {
			return fmt.Errorf("BEGIN %s inside a transaction", m.FinalLSN)
		}
		s.txn, s.commit = s.tr.Begin(), m.CommitTime
	case *pglogrepl.InsertMessage:
		if s.txn == nil {
			return errors.New("INSERT outside a transaction")
		}
		r, err := s.dec.record(m, s.commit)
		if err != nil {
			return err
		}
		x := s.txn
		s.tr.Produced(x)
		s.cl.Produce(s.pctx, r, func(_ *kgo.Record, err error) { s.tr.Acked(x, err) })
	case *pglogrepl.CommitMessage:
		if s.txn == nil {
			return fmt.Errorf("COMMIT %s outside a transaction", m.CommitLSN)
		}
		s.tr.Commit(s.txn, m.TransactionEndLSN)
		s.txn = nil
	}
	return nil
}

// status confirms the acknowledged position (write = flush = apply: nothing
// past it is the client's), and ends the stream on a failed record.
func (s *stream) status() error {
	lsn, err := s.tr.Confirmable()
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	return s.sendStatus(lsn)
}

func (s *stream) sendStatus(lsn pglogrepl.LSN) error {
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn,
		pglogrepl.StandbyStatusUpdate{WALWritePosition: lsn, WALFlushPosition: lsn, WALApplyPosition: lsn})
	if err != nil {
		return fmt.Errorf("status update: %w", err)
	}
	return nil
}

// finish waits for the records produced (within Grace after a stop), then
// confirms what was acknowledged. A transaction cut short by the stop is
// not confirmed: the slot sends it again.
func (s *stream) finish(readErr error) error {
	ferr := s.cl.Flush(s.pctx)
	lsn, ackErr := s.tr.Confirmable()
	var serr error
	if lsn > 0 {
		serr = s.sendStatus(lsn)
	}
	s.log.Info("stopped", "events", s.tr.Events(), "confirmed", lsn, "in_flight_txns", s.tr.InFlight())
	switch {
	case readErr != nil:
		return readErr
	case ackErr != nil:
		return fmt.Errorf("kafka: %w", ackErr)
	case ferr != nil:
		return fmt.Errorf("flush: %w", ferr)
	}
	return serr
}
