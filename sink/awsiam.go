package sink

import (
	"context"
	"errors"

	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/aws"
)

// AWS environment variables read for AWS_MSK_IAM, at every connection.
const (
	EnvAWSAccessKeyID     = "AWS_ACCESS_KEY_ID"
	EnvAWSSecretAccessKey = "AWS_SECRET_ACCESS_KEY"
	EnvAWSSessionToken    = "AWS_SESSION_TOKEN" // temporary credentials only
)

// AWSCredentialsProblem says why AWS_MSK_IAM cannot sign with the
// environment's credentials; "" when it can. Only the standard variables
// are supported (not the shared credentials file, web identity or instance
// metadata): run under something that exports them.
func AWSCredentialsProblem(getenv func(string) string) string {
	if getenv(EnvAWSAccessKeyID) == "" || getenv(EnvAWSSecretAccessKey) == "" {
		return EnvAWSAccessKeyID + " and " + EnvAWSSecretAccessKey + " must be set in the environment"
	}
	return ""
}

// awsMechanism is AWS_MSK_IAM: franz-go signs a kafka-cluster:Connect
// request (SigV4, region from the broker's host name or AWS_REGION) with
// the credentials getenv gives at each connection.
func awsMechanism(getenv func(string) string) sasl.Mechanism {
	return aws.ManagedStreamingIAM(func(context.Context) (aws.Auth, error) {
		if p := AWSCredentialsProblem(getenv); p != "" {
			return aws.Auth{}, errors.New("AWS_MSK_IAM: " + p)
		}
		return aws.Auth{
			AccessKey:    getenv(EnvAWSAccessKeyID),
			SecretKey:    getenv(EnvAWSSecretAccessKey),
			SessionToken: getenv(EnvAWSSessionToken),
			UserAgent:    "outbox-cdc",
		}, nil
	})
}
