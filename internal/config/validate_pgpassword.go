package config

import "time"

// passwordCommand checks postgres.password_command: one source of password
// only, and a timeout that lets a token CLI answer without stalling every
// reconnect. The command is not run here: it may mint a token each time.
func (v *validator) passwordCommand(pg Postgres) {
	if pg.PasswordCommand == "" {
		return
	}
	const key = "postgres.password_command"
	if pg.PasswordFile != "" {
		v.add(key, "", "set together with postgres.password_file",
			"keep one: remove postgres.password_command or postgres.password_file")
	}
	keys := [...]string{"postgres.dsn", "postgres.primary_dsn"}
	for i, dsn := range []DSN{pg.DSN, pg.PrimaryDSN} {
		if dsnHasPassword(string(dsn)) {
			v.add(key, "", "set while "+keys[i]+" has a password too",
				"remove the password from "+keys[i]+" (or "+envName(keys[i])+"), or remove "+key)
		}
	}
	v.durationRange("postgres.password_command_timeout", pg.PasswordCommandTimeout, 100*time.Millisecond, 5*time.Minute,
		"every connection attempt waits for the command")
}
