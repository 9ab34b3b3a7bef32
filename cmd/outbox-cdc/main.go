// Command outbox-cdc streams rows inserted into a PostgreSQL outbox table to
// Kafka. See README.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/outbox-cdc/outbox-cdc/internal/cli"
)

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sigs // first: stop reading, drain, confirm, exit 0
		cancel()
		<-sigs // second: exit at once
		fmt.Fprintln(os.Stderr, "outbox-cdc: second signal, exiting without draining")
		os.Exit(cli.ExitFailure)
	}()
	os.Exit(cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Environ()))
}
