package main

import (
	"os/exec"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv/cdctest"
)

// child is a process this benchmark runs on its own (the connector, Kafka
// Connect for Debezium), so that its memory and CPU are its own. Its output
// goes to a log file whose tail explains a failure.
type child = cdctest.Process

// tailLines is how much of a child's log an error quotes.
const tailLines = 20

// startChild starts cmd with its output in logPath; the process dies with
// this one (Pdeathsig).
func startChild(name string, cmd *exec.Cmd, logPath string) (*child, error) {
	return cdctest.Start(cmd, cdctest.Options{Name: name, Log: logPath})
}
