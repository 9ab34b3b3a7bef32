// Package deploy holds no code: the directory has the container deployment
// files (Prometheus, Grafana provisioning and dashboards, the image's
// configuration), and its tests check them, docker-compose.yml and the
// Dockerfile against what the outbox-cdc binary accepts and exports, since no
// Docker engine runs in CI.
package deploy
