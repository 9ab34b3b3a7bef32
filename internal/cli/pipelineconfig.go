package cli

import (
	"fmt"
	"strings"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

// PipelineConfig translates a validated file configuration into the pipeline's.
func PipelineConfig(cfg *config.Config) (pipeline.Config, error) {
	db, err := postgresDB(cfg.Postgres)
	if err != nil {
		return pipeline.Config{}, err
	}
	var (
		tables []pipeline.Table
		srcs   []replication.OutboxTable
	)
	for _, tc := range cfg.PerTable() {
		t, src, err := outboxTable(&tc, db)
		if err != nil {
			return pipeline.Config{}, err
		}
		tables, srcs = append(tables, t), append(srcs, src)
	}
	retainFor, retainBytes, err := config.RetainWindow(cfg.Postgres.Retain)
	if err != nil { // validated already
		return pipeline.Config{}, fmt.Errorf("postgres.retain: %w", err)
	}
	primary, err := primaryDB(cfg.Postgres)
	if err != nil {
		return pipeline.Config{}, err
	}
	sec, err := kafkaSecurity(cfg.Kafka)
	if err != nil {
		return pipeline.Config{}, err
	}
	// Checked here (the files read, the mechanism known), so that a bad
	// one is a configuration error; each client builds its own options.
	if _, err := kafkaopt.SecurityOpts(sec); err != nil {
		return pipeline.Config{}, err
	}
	src := replication.Source{
		DB: db, Slot: cfg.Postgres.Slot, Publication: cfg.Postgres.Publication,
		OutboxTable: srcs[0], Others: srcs[1:], Failover: cfg.Postgres.FailoverSlot,
		Primary: primary, CheckpointTable: cfg.Checkpoint.Store == "table", Retention: cfg.Outbox.Retention > 0,
	}
	pc := pipeline.Config{
		Source:  src,
		Mapping: tables[0].Mapping,
		Routes:  tables[0].Routes,
		More:    tables[1:],
		Sink: sink.Config{
			Brokers: cfg.Kafka.Brokers, ClientID: cfg.Kafka.ClientID, DLQTopic: cfg.Kafka.DLQTopic,
			MaxBufferedRecords: cfg.Kafka.MaxBufferedRecords, MaxBufferedBytes: cfg.Kafka.MaxBufferedBytes,
			Linger: cfg.Kafka.ProducerLinger, LatencyBudget: cfg.Kafka.LatencyBudget, RequestTimeout: cfg.Kafka.RequestTimeout, Compression: cfg.Kafka.Compression,
			AutoCreateTopics: cfg.Kafka.AutoCreateTopics, TopicPartitions: int32(cfg.Kafka.TopicPartitions),
			TopicReplicationFactor: int16(cfg.Kafka.TopicReplicationFactor), UnknownTopicTimeout: cfg.Kafka.UnknownTopicTimeout,
			ParkingTopic: cfg.ParkingTopic(), MaxQuarantined: cfg.DLQ.MaxQuarantined, QuarantineTopic: cfg.QuarantineTopic(),
			Security: sec,
		},
		DrainTimeout:    cfg.Kafka.DrainTimeout,
		StatusInterval:  cfg.Postgres.StatusInterval,
		BackoffMax:      cfg.Postgres.ReconnectBackoffMax,
		Checkpoints:     checkpointStore(cfg, src.Writer()), // the primary of a standby
		MarksTable:      marksTable(cfg),
		HoldsTable:      holdsTable(cfg),
		RetainFor:       retainFor,
		RetainBytes:     retainBytes,
		Heartbeat:       cfg.Postgres.HeartbeatInterval,
		RetainedWALWarn: cfg.Postgres.RetainedWALWarnBytes,
		QueueBytes:      cfg.Postgres.QueueBytes,
		ReceiveTimeout:  cfg.Postgres.ReceiveTimeout,
		MessagePrefix:   cfg.Outbox.MessagePrefix,
		Snapshot:        cfg.Snapshot.Mode,
		SnapshotFilter:  cfg.Snapshot.Filter,
		SnapshotOrderBy: cfg.Snapshot.OrderBy,
		Retention: pipeline.RetentionConfig{After: cfg.Outbox.Retention, BatchSize: cfg.Outbox.RetentionBatchSize,
			DutyCycle: cfg.Outbox.RetentionDutyCycle, Interval: cfg.Outbox.RetentionInterval,
			PartitionWidth: cfg.Outbox.PartitionWidth, PartitionsAhead: cfg.Outbox.PartitionsAhead},
	}
	if cfg.Kafka.ExactlyOnce() {
		pc.ExactlyOnce = &pipeline.ExactlyOnce{Interval: cfg.Kafka.TransactionInterval, Timeout: cfg.Kafka.TransactionTimeout,
			PositionsTopic: cfg.Kafka.PositionsTopic}
	}
	if pc.Contracts, err = pipelineContracts(cfg.Contracts); err != nil {
		return pipeline.Config{}, err
	}
	return pc, nil
}

// pipelineContracts translates contracts.*; nil when off. The client sends
// nothing until the first event, so a registry that is down does not stop
// the start.
func pipelineContracts(c config.Contracts) (*pipeline.Contracts, error) {
	if !c.Enabled() {
		return nil, nil
	}
	ct, err := newContracts(c, "")
	if err != nil {
		return nil, err
	}
	action := map[string]pipeline.ContractAction{config.ContractsQuarantine: pipeline.ContractDeadLetter,
		config.ContractsDLQ: pipeline.ContractDeadLetter, config.ContractsPass: pipeline.ContractPass, config.ContractsFail: pipeline.ContractFail}
	return &pipeline.Contracts{Apply: ct, Encode: c.Mode == string(contracts.ModeEncode),
		OnViolation: action[c.OnViolation], UnknownType: action[c.UnknownType],
		RegistryURL: c.Registry.URL, MediaType: contracts.MediaType(contracts.Format(c.Format), contracts.Mode(c.Mode))}, nil
}

// outboxTable translates one outbox table's configuration (config.PerTable)
// into its mapping, routes and mapped columns.
func outboxTable(tc *config.Config, db *replication.DB) (pipeline.Table, replication.OutboxTable, error) {
	schema, table := tc.Outbox.SchemaTable()
	c := tc.Outbox.Columns
	routes := tc.Routes()
	mapping := decode.Mapping{
		Schema: schema, Table: table,
		ID: c.ID, AggregateType: c.AggregateType, AggregateID: c.AggregateID, EventType: c.EventType, Payload: c.Payload,
		HeaderColumns: headerColumns(tc.Outbox), Columns: routes.Columns(),
	}
	if err := mapping.Validate(); err != nil {
		return pipeline.Table{}, replication.OutboxTable{}, err
	}
	cols := append([]string{c.ID, c.AggregateType, c.AggregateID, c.EventType, c.Payload}, headerColumns(tc.Outbox)...)
	cols = append(cols, mapping.Columns...)
	routes.Format, routes.CloudEvents = cloudEvents(tc.Kafka, db, schema, table)
	return pipeline.Table{Mapping: mapping, Routes: routes},
		replication.OutboxTable{Schema: schema, Table: table, Columns: cols}, nil
}

// kafkaSecurity translates kafka.tls and kafka.sasl for the sink. The
// password file is read here (OAUTHBEARER token files and client secret
// files at each use), and the CA, certificate and key files by
// kafkaopt.SecurityOpts, at start.
func kafkaSecurity(k config.Kafka) (kafkaopt.Security, error) {
	sec := kafkaopt.Security{TLS: k.TLS.Sink()}
	switch k.SASL.Mechanism {
	case "":
	case kafkaopt.MechanismOAuthBearer, kafkaopt.MechanismAWSMSKIAM:
		sec.SASL = &kafkaopt.SASL{Mechanism: k.SASL.Mechanism, OAuth: k.SASL.OAuth.Sink()}
	default:
		pw, err := k.SASL.Secret()
		if err != nil {
			return kafkaopt.Security{}, err
		}
		sec.SASL = &kafkaopt.SASL{Mechanism: k.SASL.Mechanism, Username: k.SASL.Username, Password: kafkaopt.Secret(pw)}
	}
	return sec, nil
}

// postgresDB parses postgres.dsn once and gives it the password source of
// postgres.password_file or postgres.password_command, used at every
// connection attempt: the password goes to the driver's settings for that
// connect only, never into a DSN string (which could end up in a message)
// nor into the process environment. A DSN with its own password was
// rejected by validation.
func postgresDB(p config.Postgres) (*replication.DB, error) {
	return replication.ParseDB(string(p.DSN), p.PasswordSource())
}

// primaryDB parses postgres.primary_dsn like postgres.dsn; nil when unset.
func primaryDB(p config.Postgres) (*replication.DB, error) {
	if p.PrimaryDSN == "" {
		return nil, nil
	}
	d, err := replication.ParseDB(string(p.PrimaryDSN), p.PasswordSource())
	if err != nil {
		return nil, fmt.Errorf("postgres.primary_dsn: %w", err)
	}
	return d, nil
}

// marksTable is the history marks table: history_marks beside the
// checkpoint table (checkpoint.table names a schema whatever the store).
func marksTable(cfg *config.Config) string {
	schema, _, _ := strings.Cut(cfg.Checkpoint.Table, ".")
	return schema + ".history_marks"
}

// holdsTable is the lost slots' repair holds table, beside the marks: in the
// database, where every instance of a deployment sees it whatever its
// checkpoint store, and where deleting a checkpoint leaves it.
func holdsTable(cfg *config.Config) string {
	schema, _, _ := strings.Cut(cfg.Checkpoint.Table, ".")
	return schema + ".repair_holds"
}

// checkpointStore builds the configured store; nil for none.
func checkpointStore(cfg *config.Config, db *replication.DB) offsets.Store {
	switch cfg.Checkpoint.Store {
	case "table":
		return replication.NewTableStore(db, cfg.Checkpoint.Table, cfg.Postgres.Slot)
	case "file":
		return offsets.NewFileStore(cfg.Checkpoint.File)
	}
	return nil
}
