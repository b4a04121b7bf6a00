package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/throttler-dev/throttler/internal/config"
)

func newTokenCommand() *cobra.Command {
	c := &cobra.Command{Use: "token", Short: "Make API tokens"}
	var name, role string
	var tenants []string
	newCmd := &cobra.Command{
		Use:   "new",
		Short: "Print a fresh API token and the [[auth.tokens]] lines to paste into config.toml",
		Long: `Print a fresh random API token (256 bits) and the config lines that accept it.
The config holds only the token's SHA-256: keep the token itself in the
client's secret store. It is shown once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if name == "" {
				return exitError{code: 2, err: fmt.Errorf("--name is required (it names the token in logs)")}
			}
			if role != config.RoleAdmin && role != config.RoleProducer && role != config.RoleViewer {
				return exitError{code: 2, err: fmt.Errorf("--role %q: use admin, producer or viewer", role)}
			}
			for _, t := range tenants {
				if t != "*" && !config.ValidName(t) {
					return exitError{code: 2, err: fmt.Errorf("--tenants: %q is not a tenant name", t)}
				}
			}
			var raw [32]byte
			if _, err := rand.Read(raw[:]); err != nil {
				return err
			}
			token := "thr_" + base64.RawURLEncoding.EncodeToString(raw[:])
			sum := sha256.Sum256([]byte(token))
			quoted := make([]string, len(tenants))
			for i, t := range tenants {
				quoted[i] = fmt.Sprintf("%q", t)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "token (give it to the client; it is not stored anywhere):\n\n  %s\n\n", token)
			fmt.Fprintf(out, "add to config.toml:\n\n[[auth.tokens]]\nname = %q\nsha256 = %q\nrole = %q\ntenants = [%s]\n",
				name, hex.EncodeToString(sum[:]), role, strings.Join(quoted, ", "))
			return nil
		},
	}
	newCmd.Flags().StringVar(&name, "name", "", "name of the token, for logs (required)")
	newCmd.Flags().StringVar(&role, "role", config.RoleProducer, "admin, producer or viewer")
	newCmd.Flags().StringSliceVar(&tenants, "tenants", []string{"*"}, "tenants it may reach, comma separated, or *")
	c.AddCommand(newCmd)
	return c
}
