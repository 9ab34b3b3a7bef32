package kafkaopt

import (
	"context"
	"encoding/xml"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/aws"
)

// AWS environment variables read for AWS_MSK_IAM, at every connection.
const (
	EnvAWSAccessKeyID     = "AWS_ACCESS_KEY_ID"
	EnvAWSSecretAccessKey = "AWS_SECRET_ACCESS_KEY"
	EnvAWSSessionToken    = "AWS_SESSION_TOKEN" // temporary credentials only
	// Web identity (EKS IAM roles for service accounts): the token file is
	// exchanged for temporary credentials with STS.
	EnvAWSWebIdentityTokenFile = "AWS_WEB_IDENTITY_TOKEN_FILE"
	EnvAWSRoleARN              = "AWS_ROLE_ARN"
	EnvAWSRoleSessionName      = "AWS_ROLE_SESSION_NAME" // optional
	EnvAWSEndpointURLSTS       = "AWS_ENDPOINT_URL_STS"  // optional; default: the regional endpoint
)

// AWSCredentialsProblem says why AWS_MSK_IAM has no credentials in the
// environment; "" when it has. Supported: the access key variables, or web
// identity (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN); not the shared
// credentials file nor instance metadata.
func AWSCredentialsProblem(getenv func(string) string) string {
	if getenv(EnvAWSAccessKeyID) != "" && getenv(EnvAWSSecretAccessKey) != "" {
		return ""
	}
	if getenv(EnvAWSWebIdentityTokenFile) != "" && getenv(EnvAWSRoleARN) != "" {
		return ""
	}
	return EnvAWSAccessKeyID + " and " + EnvAWSSecretAccessKey + ", or " + EnvAWSWebIdentityTokenFile + " and " +
		EnvAWSRoleARN + ", must be set in the environment"
}

// awsMechanism is AWS_MSK_IAM: franz-go signs a kafka-cluster:Connect
// request (SigV4, region from the broker's host name or AWS_REGION) with
// the credentials of getenv, looked up at each connection.
func awsMechanism(getenv func(string) string) sasl.Mechanism {
	c := &awsCredentials{getenv: getenv, client: &http.Client{Timeout: 30 * time.Second}, now: time.Now}
	return aws.ManagedStreamingIAM(c.auth)
}

// awsCredentials gives the access keys of the environment, or temporary
// credentials for a web identity, cached until shortly before they expire
// (refreshMargin).
type awsCredentials struct {
	getenv func(string) string
	client *http.Client
	now    func() time.Time
	cache  expiring[aws.Auth]
}

func (c *awsCredentials) auth(ctx context.Context) (aws.Auth, error) {
	if id, secret := c.getenv(EnvAWSAccessKeyID), c.getenv(EnvAWSSecretAccessKey); id != "" && secret != "" {
		return aws.Auth{AccessKey: id, SecretKey: secret, SessionToken: c.getenv(EnvAWSSessionToken), UserAgent: "outbox-cdc"}, nil
	}
	if p := AWSCredentialsProblem(c.getenv); p != "" {
		return aws.Auth{}, errors.New("AWS_MSK_IAM: " + p)
	}
	now := c.now()
	return c.cache.get(now, func() (aws.Auth, time.Duration, error) {
		auth, expires, err := c.assumeRole(ctx)
		return auth, max(expires.Sub(now), 0), err
	})
}

// stsEndpoint is AWS_ENDPOINT_URL_STS, else the regional endpoint, else the
// global one.
func (c *awsCredentials) stsEndpoint() string {
	if u := c.getenv(EnvAWSEndpointURLSTS); u != "" {
		return u
	}
	for _, k := range []string{"AWS_REGION", "AWS_DEFAULT_REGION"} {
		if r := c.getenv(k); r != "" {
			return "https://sts." + r + ".amazonaws.com"
		}
	}
	return "https://sts.amazonaws.com"
}

// assumeRole exchanges the web identity token for temporary credentials
// (STS AssumeRoleWithWebIdentity, which is not signed). The token file is
// read at every call: the kubelet replaces it.
func (c *awsCredentials) assumeRole(ctx context.Context) (aws.Auth, time.Time, error) {
	endpoint := c.stsEndpoint()
	fail := func(problem string) (aws.Auth, time.Time, error) {
		return aws.Auth{}, time.Time{}, &TokenError{What: "AWS credentials", Source: "STS AssumeRoleWithWebIdentity " + redactURL(endpoint),
			Problem: problem, Check: EnvAWSRoleARN + ", " + EnvAWSWebIdentityTokenFile + " and the role's trust policy"}
	}
	tokenFile := c.getenv(EnvAWSWebIdentityTokenFile)
	tok, err := ReadSecretFile(tokenFile)
	if err != nil {
		return fail(EnvAWSWebIdentityTokenFile + " " + tokenFile + ": " + err.Error())
	}
	session := c.getenv(EnvAWSRoleSessionName)
	if session == "" {
		session = "outbox-cdc-" + strconv.FormatInt(c.now().Unix(), 10)
	}
	form := url.Values{"Action": {"AssumeRoleWithWebIdentity"}, "Version": {"2011-06-15"},
		"RoleArn": {c.getenv(EnvAWSRoleARN)}, "RoleSessionName": {session}, "WebIdentityToken": {strings.TrimSpace(string(tok))}}
	resp, body, err := postForm(ctx, c.client, endpoint, form, nil)
	if err != nil {
		return fail(err.Error())
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Code    string `xml:"Error>Code"`
			Message string `xml:"Error>Message"`
		}
		_ = xml.Unmarshal(body, &e)
		problem := "answered " + resp.Status
		if e.Code != "" {
			problem += ": " + LogText(e.Code) + " (" + LogText(e.Message) + ")"
		}
		return fail(problem)
	}
	var r struct {
		Creds struct {
			AccessKeyID     string    `xml:"AccessKeyId"`
			SecretAccessKey string    `xml:"SecretAccessKey"`
			SessionToken    string    `xml:"SessionToken"`
			Expiration      time.Time `xml:"Expiration"`
		} `xml:"AssumeRoleWithWebIdentityResult>Credentials"`
	}
	if err := xml.Unmarshal(body, &r); err != nil || r.Creds.AccessKeyID == "" || r.Creds.SecretAccessKey == "" {
		return fail("the answer holds no credentials")
	}
	return aws.Auth{AccessKey: r.Creds.AccessKeyID, SecretKey: r.Creds.SecretAccessKey,
		SessionToken: r.Creds.SessionToken, UserAgent: "outbox-cdc"}, r.Creds.Expiration, nil
}
