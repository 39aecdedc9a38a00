// Package charttest tests the Helm chart in deploy/helm/cdc-outbox without a
// cluster, on what Kubernetes would check, and runs the pods it renders.
//
// It is a Go module of its own so that Helm's and Kubernetes' dependencies
// never enter the streamer's go.mod; `make test` runs it (make test-chart).
//
//   - helm lint and helm template, with Helm's own packages (helm.sh/helm/v3),
//     for every value set of valueSets, and the values the chart must refuse.
//   - Every rendered object is decoded strictly into its Kubernetes API type
//     (k8s.io/api; monitoring.coreos.com's from prometheus-operator): an
//     unknown or duplicated field, a wrong type, an unparsable quantity or an
//     unknown kind fails. Then the checks the API server's validation makes
//     that matter here (names, labels, selectors matching the pods, ports
//     and probes naming a declared port, every mount a volume), and the
//     chart's promises (non-root, read-only root filesystem, no capabilities,
//     secrets by reference only, the grace period above the drain).
//     A real kube-apiserver and etcd are not used: docs/kubernetes.md says
//     why.
//   - The PrometheusRule's rules are deploy/prometheus/alerts.yml (the chart
//     reads it through a link) and pass promtool's check and the unit tests
//     of deploy/prometheus/alerts_test.yml.
//   - pod_test.go runs the rendered container (command, environment,
//     mounted files) with the real binary against the test servers, and
//     simulates a rolling update.
package charttest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "../cdc-outbox"
	repoRoot  = "../../.."
	namespace = "payments"
)

// The secrets the value sets refer to, as a cluster would hold them. The
// passwords must appear in no rendered object.
const (
	pgPassword   = "pg-secret-9f3a1c"
	saslPassword = "sasl-secret-77d0e2"
)

// valueSets are the values the chart is rendered, linted and validated
// with; each is a values file as a user writes one.
var valueSets = map[string]string{
	"default": `
config:
  postgres-url: postgres://app_cdc@db.payments:5432/payments
  kafka-brokers: [kafka-0.kafka:9092, kafka-1.kafka:9092]
`,
	"tls-sasl": `
config:
  postgres-url: postgres://app_cdc@db.payments:5432/payments?sslmode=verify-full
  kafka-brokers: [kafka-0.kafka:9093]
  kafka-sasl-mechanism: scram-sha-512
  kafka-sasl-username: cdc
postgres:
  passwordSecret: {name: payments-db, key: password}
  tls: {secretName: payments-db-tls, caKey: ca.crt, certKey: tls.crt, keyKey: tls.key}
kafka:
  sasl:
    passwordSecret: {name: kafka-cdc, key: password}
  tls: {enabled: true, secretName: kafka-ca, caKey: ca.crt}
`,
	"exactly-once": `
config:
  postgres-url: postgres://app_cdc@db.payments:5432/payments
  kafka-brokers: kafka-0.kafka:9092
  delivery: exactly-once
  checkpoint-topic: cdc_outbox.checkpoints
  transaction-interval: 200ms
postgres:
  passwordSecret: {name: payments-db, key: password}
`,
	"metrics-off": `
config:
  postgres-url: postgres://app_cdc@db.payments:5432/payments
  kafka-brokers: [kafka:9092]
service: {enabled: false}
podDisruptionBudget: {enabled: false}
replicaCount: 1
`,
	"monitoring": `
config:
  postgres-url: postgres://app_cdc@db.payments:5432/payments
  kafka-brokers: [kafka:9092]
serviceMonitor: {enabled: true, labels: {release: kube-prometheus-stack}}
prometheusRule: {enabled: true, labels: {release: kube-prometheus-stack}}
grafanaDashboard: {enabled: true, annotations: {grafana_folder: Outbox}}
`,
	"several-outboxes": `
config:
  postgres-url: postgres://app_cdc@db.shop:5432/shop
  kafka-brokers: [kafka:9092]
  outboxes:
    - table: orders.outbox
      topic: orders.{aggregate_type}
    - table: billing.outbox
      topic: billing.{aggregate_type}
      column-payload: body
image: {repository: registry.example/cdc-outbox, digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
fullnameOverride: shop-cdc
`,
}

// secrets are the Secrets the value sets name, key by key.
var secrets = map[string]map[string]string{
	"payments-db":     {"password": pgPassword},
	"payments-db-tls": {"ca.crt": "-----BEGIN CERTIFICATE-----\n", "tls.crt": "-----BEGIN CERTIFICATE-----\n", "tls.key": "-----BEGIN PRIVATE KEY-----\n"},
	"kafka-cdc":       {"password": saslPassword},
	"kafka-ca":        {"ca.crt": "-----BEGIN CERTIFICATE-----\n"},
}

func values(t *testing.T, doc string) map[string]any {
	t.Helper()
	var v map[string]any
	if err := yaml.Unmarshal([]byte(doc), &v); err != nil {
		t.Fatalf("value set: %v", err)
	}
	return v
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load the chart: %v", err)
	}
	return c
}

// renderChart is helm template: an install rendered without a cluster.
func renderChart(t *testing.T, release string, vals map[string]any) (manifest, notes string, err error) {
	t.Helper()
	install := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	install.DryRun = true
	install.ClientOnly = true
	install.Replace = true
	install.ReleaseName = release
	install.Namespace = namespace
	kv, err := chartutil.ParseKubeVersion("v1.31.0")
	if err != nil {
		t.Fatal(err)
	}
	install.KubeVersion = kv
	rel, err := install.Run(loadChart(t), vals)
	if err != nil {
		return "", "", err
	}
	return rel.Manifest, rel.Info.Notes, nil
}

// ------------------------------------------------------------------ lint

func TestLint(t *testing.T) {
	for name, doc := range valueSets {
		t.Run(name, func(t *testing.T) {
			linter := lint.AllWithKubeVersion(chartDir, values(t, doc), namespace, nil)
			for _, m := range linter.Messages {
				// INFO is advice such as "icon is recommended"; warnings
				// and errors fail.
				if m.Severity > support.InfoSev {
					t.Errorf("helm lint: %s", m)
				} else {
					t.Logf("helm lint: %s", m)
				}
			}
		})
	}
}

// TestRefusedValues: values the chart must refuse, and why.
func TestRefusedValues(t *testing.T) {
	for name, tc := range map[string]struct{ doc, want string }{
		"a key the chart sets": {`
config: {postgres-url: postgres://a@db/x, kafka-brokers: [k:9092], http-addr: ":9090"}`, "/config/http-addr"},
		"a password in clear": {`
config: {postgres-url: postgres://a@db/x, kafka-brokers: [k:9092], kafka-sasl-password: hunter2}`, "/config/kafka-sasl-password"},
		"no postgres-url": {`
config: {kafka-brokers: [k:9092]}`, "config.postgres-url is required"},
		// The outboxes share the stream's one connection: a list of them
		// needs the URL as much (it once rendered postgres-url: "").
		"outboxes but no postgres-url": {`
config:
  kafka-brokers: [k:9092]
  outboxes: [{table: orders.outbox}]`, "config.postgres-url is required"},
		"no brokers": {`
config: {postgres-url: postgres://a@db/x}`, "config.kafka-brokers is required"},
		"a mistyped value": {`
config: {postgres-url: postgres://a@db/x, kafka-brokers: [k:9092]}
replicas: 3`, "replicas"},
		"a wrong delivery": {`
config: {postgres-url: postgres://a@db/x, kafka-brokers: [k:9092], delivery: exactly_once}`, "delivery"},
		"a service monitor without a service": {`
config: {postgres-url: postgres://a@db/x, kafka-brokers: [k:9092]}
service: {enabled: false}
serviceMonitor: {enabled: true}`, "serviceMonitor.enabled needs service.enabled"},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := renderChart(t, "r", values(t, tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("rendered with error %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

// -------------------------------------------------------------- objects

// objects is what one render holds, decoded.
type objects struct {
	deployment      *appsv1.Deployment
	configMaps      map[string]*corev1.ConfigMap
	service         *corev1.Service
	pdb             *policyv1.PodDisruptionBudget
	serviceAccount  *corev1.ServiceAccount
	serviceMonitor  *monitoringv1.ServiceMonitor
	prometheusRule  *monitoringv1.PrometheusRule
	kinds           []string
	manifest, notes string
}

var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme, monitoringv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// strict decodes YAML into the registered API types, refusing unknown and
// duplicated fields, as kubectl apply --validate=strict does.
var strict = kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme, kjson.SerializerOptions{Yaml: true, Strict: true})

// decode renders the chart and decodes every object strictly.
func decode(t *testing.T, release string, vals map[string]any) *objects {
	t.Helper()
	manifest, notes, err := renderChart(t, release, vals)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	o := &objects{configMaps: map[string]*corev1.ConfigMap{}, manifest: manifest, notes: notes}
	docs := releaseutil.SplitManifests(manifest)
	names := make([]string, 0, len(docs))
	for k := range docs {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		doc := docs[k]
		if strings.TrimSpace(doc) == "" {
			continue
		}
		obj, gvk, err := strict.Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("%s does not decode strictly into its Kubernetes type: %v\n%s", k, err, doc)
		}
		o.kinds = append(o.kinds, gvk.Kind)
		switch v := obj.(type) {
		case *appsv1.Deployment:
			o.deployment = v
		case *corev1.ConfigMap:
			o.configMaps[v.Name] = v
		case *corev1.Service:
			o.service = v
		case *policyv1.PodDisruptionBudget:
			o.pdb = v
		case *corev1.ServiceAccount:
			o.serviceAccount = v
		case *monitoringv1.ServiceMonitor:
			o.serviceMonitor = v
		case *monitoringv1.PrometheusRule:
			o.prometheusRule = v
		default:
			t.Fatalf("%s: unexpected kind %s", k, gvk)
		}
	}
	if o.deployment == nil {
		t.Fatal("no Deployment rendered")
	}
	return o
}

// container is the Deployment's one container.
func (o *objects) container(t *testing.T) corev1.Container {
	t.Helper()
	cs := o.deployment.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("%d containers, want 1", len(cs))
	}
	return cs[0]
}

// configFile is the configuration file the container reads, decoded.
func (o *objects) configFile(t *testing.T) map[string]any {
	t.Helper()
	cm := o.configMaps[o.deployment.Name]
	if cm == nil {
		t.Fatalf("no ConfigMap %s", o.deployment.Name)
	}
	var cfg map[string]any
	if err := yaml.UnmarshalStrict([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
		t.Fatalf("config.yaml: %v", err)
	}
	return cfg
}

func TestRenderedObjects(t *testing.T) {
	for name, doc := range valueSets {
		t.Run(name, func(t *testing.T) {
			vals := values(t, doc)
			o := decode(t, "payments", vals)
			validateMeta(t, o)
			validatePod(t, o, secrets)
			validateWiring(t, o)
			validateConfig(t, o, vals)
			noSecretInClear(t, o)
			if !strings.Contains(o.notes, "standby") {
				t.Errorf("NOTES.txt does not say what the standby does:\n%s", o.notes)
			}
			t.Logf("%s: %s", name, strings.Join(o.kinds, ", "))
		})
	}
}

// validateMeta checks names, namespaces and labels as the API server does,
// and the chart's app.kubernetes.io labels.
func validateMeta(t *testing.T, o *objects) {
	t.Helper()
	var metas []metav1.ObjectMeta
	metas = append(metas, o.deployment.ObjectMeta, o.deployment.Spec.Template.ObjectMeta)
	for _, cm := range o.configMaps {
		metas = append(metas, cm.ObjectMeta)
	}
	if o.service != nil {
		metas = append(metas, o.service.ObjectMeta)
		if errs := validation.IsDNS1035Label(o.service.Name); len(errs) > 0 {
			t.Errorf("Service name %q: %v", o.service.Name, errs)
		}
	}
	for _, m := range []*metav1.ObjectMeta{pdbMeta(o), saMeta(o), smMeta(o), prMeta(o)} {
		if m != nil {
			metas = append(metas, *m)
		}
	}
	for i, m := range metas {
		if i != 1 { // the pod template's name and namespace come from its owner
			if errs := validation.IsDNS1123Subdomain(m.Name); len(errs) > 0 {
				t.Errorf("name %q: %v", m.Name, errs)
			}
			if m.Namespace != namespace {
				t.Errorf("%s: namespace %q, want the release's %q", m.Name, m.Namespace, namespace)
			}
		}
		for k, v := range m.Labels {
			if errs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(errs) > 0 {
				t.Errorf("%s: label %s=%q: %v", m.Name, k, v, errs)
			}
		}
		for k := range m.Annotations {
			if errs := validation.IsQualifiedName(strings.ToLower(k)); len(errs) > 0 {
				t.Errorf("%s: annotation %s: %v", m.Name, k, errs)
			}
		}
		for _, l := range []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "helm.sh/chart"} {
			if m.Labels[l] == "" {
				t.Errorf("%s: no label %s", m.Name, l)
			}
		}
	}
}

func pdbMeta(o *objects) *metav1.ObjectMeta {
	if o.pdb == nil {
		return nil
	}
	return &o.pdb.ObjectMeta
}

func saMeta(o *objects) *metav1.ObjectMeta {
	if o.serviceAccount == nil {
		return nil
	}
	return &o.serviceAccount.ObjectMeta
}

func smMeta(o *objects) *metav1.ObjectMeta {
	if o.serviceMonitor == nil {
		return nil
	}
	return &o.serviceMonitor.ObjectMeta
}

func prMeta(o *objects) *metav1.ObjectMeta {
	if o.prometheusRule == nil {
		return nil
	}
	return &o.prometheusRule.ObjectMeta
}

// validatePod checks the pod template: what the API server refuses and
// what the chart promises.
func validatePod(t *testing.T, o *objects, secrets map[string]map[string]string) {
	t.Helper()
	d := o.deployment
	spec := d.Spec.Template.Spec
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("the Deployment's selector %v does not select its pods %v (%v)", d.Spec.Selector, d.Spec.Template.Labels, err)
	}
	c := o.container(t)
	ports := map[string]int32{}
	for _, p := range c.Ports {
		if errs := validation.IsValidPortName(p.Name); len(errs) > 0 {
			t.Errorf("port name %q: %v", p.Name, errs)
		}
		ports[p.Name] = p.ContainerPort
	}
	for what, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("no %s probe over HTTP", what)
			continue
		}
		if _, ok := ports[p.HTTPGet.Port.String()]; !ok {
			t.Errorf("%s probe on port %s, which the container does not declare (%v)", what, p.HTTPGet.Port.String(), ports)
		}
	}
	if p := c.ReadinessProbe; p != nil && p.HTTPGet != nil && p.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe on %s, want /readyz", p.HTTPGet.Path)
	}
	if p := c.LivenessProbe; p != nil && p.HTTPGet != nil && p.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probe on %s, want /healthz", p.HTTPGet.Path)
	}
	for _, e := range c.Env {
		if errs := validation.IsEnvVarName(e.Name); len(errs) > 0 {
			t.Errorf("env %s: %v", e.Name, errs)
		}
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			if _, ok := secrets[e.ValueFrom.SecretKeyRef.Name][e.ValueFrom.SecretKeyRef.Key]; !ok {
				t.Errorf("env %s names secret %s key %s, which the value set does not give", e.Name, e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
			}
		}
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		if errs := validation.IsDNS1123Label(v.Name); len(errs) > 0 {
			t.Errorf("volume %q: %v", v.Name, errs)
		}
		volumes[v.Name] = v
		switch {
		case v.ConfigMap != nil:
			if o.configMaps[v.ConfigMap.Name] == nil {
				t.Errorf("volume %s mounts ConfigMap %s, which is not rendered", v.Name, v.ConfigMap.Name)
			}
		case v.Secret != nil:
			if secrets[v.Secret.SecretName] == nil {
				t.Errorf("volume %s mounts Secret %s, which the value set does not name", v.Name, v.Secret.SecretName)
			}
		default:
			t.Errorf("volume %s is neither a ConfigMap nor a Secret", v.Name)
		}
	}
	for _, m := range c.VolumeMounts {
		if _, ok := volumes[m.Name]; !ok {
			t.Errorf("mount %s names no volume", m.Name)
		}
		if !m.ReadOnly {
			t.Errorf("mount %s is writable", m.Name)
		}
	}
	for name, q := range c.Resources.Requests {
		if l, ok := c.Resources.Limits[name]; ok && q.Cmp(l) > 0 {
			t.Errorf("request %s %s above its limit %s", name, q.String(), l.String())
		}
	}
	if len(c.Resources.Requests) == 0 || len(c.Resources.Limits) == 0 {
		t.Errorf("resources %v: want requests and limits", c.Resources)
	}

	// The chart's promises.
	psc, sc := spec.SecurityContext, c.SecurityContext
	switch {
	case psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0:
		t.Errorf("pod security context %+v: want non-root", psc)
	case sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("container security context %+v: want a read-only root filesystem", sc)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("container security context: privilege escalation allowed")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("container capabilities %+v: want all dropped", sc.Capabilities)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the pods mount a service account token; cdc-outbox never calls the API")
	}
	if r := d.Spec.Replicas; r == nil {
		t.Error("no replicas")
	}
	if s := d.Spec.Strategy; s.Type != appsv1.RollingUpdateDeploymentStrategyType || s.RollingUpdate == nil ||
		s.RollingUpdate.MaxUnavailable == nil || s.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Errorf("strategy %+v: want a rolling update that takes no pod away before its successor is ready", s)
	}
	if c.Image == "" || strings.HasSuffix(c.Image, ":") {
		t.Errorf("image %q", c.Image)
	}
}

// validateWiring checks that the objects refer to each other: the Service
// and the budget select the pods, the ServiceMonitor the Service's port.
func validateWiring(t *testing.T, o *objects) {
	t.Helper()
	pods := labels.Set(o.deployment.Spec.Template.Labels)
	if s := o.service; s != nil {
		if len(s.Spec.Selector) == 0 || !labels.SelectorFromSet(s.Spec.Selector).Matches(pods) {
			t.Errorf("the Service selects %v, not the pods %v", s.Spec.Selector, pods)
		}
		ports := map[string]bool{}
		for _, p := range o.container(t).Ports {
			ports[p.Name] = true
		}
		for _, p := range s.Spec.Ports {
			if !ports[p.TargetPort.String()] {
				t.Errorf("Service port %s targets %s, which the container does not declare", p.Name, p.TargetPort.String())
			}
		}
		if !s.Spec.PublishNotReadyAddresses {
			t.Error("the Service leaves out pods that are not ready: Prometheus would not scrape a replica that cannot reach PostgreSQL")
		}
	}
	if p := o.pdb; p != nil {
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil || !sel.Matches(pods) {
			t.Errorf("the PodDisruptionBudget selects %v, not the pods (%v)", p.Spec.Selector, err)
		}
		if p.Spec.MaxUnavailable == nil || p.Spec.MaxUnavailable.IntValue() != 1 {
			t.Errorf("budget maxUnavailable %v, want 1", p.Spec.MaxUnavailable)
		}
	}
	if sm := o.serviceMonitor; sm != nil {
		if o.service == nil {
			t.Fatal("a ServiceMonitor without a Service")
		}
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(o.service.Labels)) {
			t.Errorf("the ServiceMonitor selects %v, not the Service's labels %v", sm.Spec.Selector, o.service.Labels)
		}
		if got := o.service.Labels[sm.Spec.JobLabel]; got != "cdc-outbox" {
			t.Errorf("the ServiceMonitor's job would be %q (label %q), want cdc-outbox, which alerts.yml and the dashboard expect", got, sm.Spec.JobLabel)
		}
		for _, ep := range sm.Spec.Endpoints {
			if !slices.ContainsFunc(o.service.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
				t.Errorf("the ServiceMonitor scrapes port %s, which the Service does not have", ep.Port)
			}
		}
	}
	sa := o.deployment.Spec.Template.Spec.ServiceAccountName
	if o.serviceAccount != nil && o.serviceAccount.Name != sa {
		t.Errorf("the pods run as %s, the chart creates %s", sa, o.serviceAccount.Name)
	}
}

// validateConfig checks the configuration file: the values' config passed
// through as written, and the keys the chart owns agreeing with the pod.
func validateConfig(t *testing.T, o *objects, vals map[string]any) {
	t.Helper()
	cfg := o.configFile(t)
	for k, want := range vals["config"].(map[string]any) {
		if got, _ := yaml.Marshal(cfg[k]); !bytes.Equal(got, must(yaml.Marshal(want))) {
			t.Errorf("config key %s: rendered %s, want it as given: %s", k, got, must(yaml.Marshal(want)))
		}
	}
	c := o.container(t)
	if cfg["http-addr"] != fmt.Sprintf(":%d", c.Ports[0].ContainerPort) {
		t.Errorf("http-addr %v, but the container's port is %d", cfg["http-addr"], c.Ports[0].ContainerPort)
	}
	drain, err := time.ParseDuration(fmt.Sprint(cfg["shutdown-timeout"]))
	if err != nil {
		t.Fatalf("shutdown-timeout: %v", err)
	}
	grace := o.deployment.Spec.Template.Spec.TerminationGracePeriodSeconds
	if grace == nil || time.Duration(*grace)*time.Second < drain+10*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v: want at least shutdown-timeout %s plus 10 s, or the kubelet SIGKILLs a draining holder", grace, drain)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if !strings.HasSuffix(env["CDC_OUTBOX_CONFIG"], "/config.yaml") {
		t.Errorf("CDC_OUTBOX_CONFIG = %q", env["CDC_OUTBOX_CONFIG"])
	}
	// Every file the configuration names is mounted.
	for _, k := range []string{"kafka-sasl-password-file", "kafka-tls-ca-file", "kafka-tls-cert-file", "kafka-tls-key-file"} {
		if p, ok := cfg[k].(string); ok && !mounted(c, p) {
			t.Errorf("%s %s is on no mount", k, p)
		}
	}
	for _, k := range []string{"PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY"} {
		if p, ok := env[k]; ok && !mounted(c, p) {
			t.Errorf("%s %s is on no mount", k, p)
		}
	}
}

func mounted(c corev1.Container, path string) bool {
	return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return strings.HasPrefix(path, m.MountPath+"/") })
}

// noSecretInClear: no Secret is rendered, and no password appears.
func noSecretInClear(t *testing.T, o *objects) {
	t.Helper()
	if slices.Contains(o.kinds, "Secret") {
		t.Error("the chart renders a Secret; secrets come from existing ones, by reference")
	}
	for _, pw := range []string{pgPassword, saslPassword} {
		if strings.Contains(o.manifest, pw) {
			t.Errorf("a password is in the rendered manifest")
		}
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// TestExactlyOnceOneTransactionalIDPerRelease: the pods of one release
// share one configuration, so one transactional id; the chart sets none of
// its own, so releases for different slots or databases get the binary's
// default for each, which differ.
func TestExactlyOnceOneTransactionalIDPerRelease(t *testing.T) {
	vals := values(t, valueSets["exactly-once"])
	o := decode(t, "payments", vals)
	if _, ok := o.configFile(t)["transactional-id"]; ok {
		t.Error("the chart sets a transactional id; releases would have to override it to differ")
	}
	for _, e := range o.container(t).Env {
		if e.Name == "CDC_OUTBOX_TRANSACTIONAL_ID" {
			t.Errorf("the pod sets %s: it must come from the one configuration file every pod reads", e.Name)
		}
	}
	if n := len(o.deployment.Spec.Template.Spec.Containers); n != 1 || *o.deployment.Spec.Replicas != 2 {
		t.Errorf("%d containers, %d replicas: want one pod template with two replicas", n, *o.deployment.Spec.Replicas)
	}
}

// ------------------------------------------------ monitoring: the rules

// TestPrometheusRuleIsAlertsFile: the PrometheusRule holds the alerts of
// deploy/prometheus/alerts.yml, aggregated per release, and passes
// promtool's check and the existing unit tests of alerts_test.yml.
func TestPrometheusRuleIsAlertsFile(t *testing.T) {
	o := decode(t, "payments", values(t, valueSets["monitoring"]))
	if o.prometheusRule == nil {
		t.Fatal("no PrometheusRule rendered")
	}
	source, err := os.ReadFile(filepath.Join(repoRoot, "deploy/prometheus/alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var want monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(source, &want); err != nil {
		t.Fatal(err)
	}
	got := o.prometheusRule.Spec
	if len(got.Groups) != len(want.Groups) || len(got.Groups) == 0 {
		t.Fatalf("%d rule groups, alerts.yml has %d", len(got.Groups), len(want.Groups))
	}
	perRelease := strings.NewReplacer("by (job", "by (job, namespace, service")
	for i, g := range want.Groups {
		if len(got.Groups[i].Rules) != len(g.Rules) {
			t.Fatalf("group %s: %d rules, alerts.yml has %d", g.Name, len(got.Groups[i].Rules), len(g.Rules))
		}
		for j, r := range g.Rules {
			gr := got.Groups[i].Rules[j]
			if gr.Alert != r.Alert || gr.Expr.String() != perRelease.Replace(r.Expr.String()) || !equalMaps(gr.Labels, r.Labels) || !equalMaps(gr.Annotations, r.Annotations) {
				t.Errorf("rule %s differs from alerts.yml's %s:\n%s\nwant\n%s", gr.Alert, r.Alert, gr.Expr.String(), perRelease.Replace(r.Expr.String()))
			}
		}
	}

	// promtool on the rules as rendered, beside a copy of the unit tests
	// (which name alerts.yml relative to themselves).
	dir := t.TempDir()
	rules := must(yaml.Marshal(got))
	if err := os.WriteFile(filepath.Join(dir, "alerts.yml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join(repoRoot, "deploy/prometheus/alerts_test.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	bin := promtoolPath(t)
	for _, args := range [][]string{
		{"check", "rules", "--lint=all", "--lint-fatal", filepath.Join(dir, "alerts.yml")},
		{"test", "rules", filepath.Join(dir, "alerts_test.yml")},
	} {
		out := runPromtool(t, bin, args...)
		if !strings.Contains(out, "SUCCESS") {
			t.Errorf("promtool %s did not say SUCCESS:\n%s", strings.Join(args, " "), out)
		}
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestDashboardIsTheFile: the dashboard ConfigMap holds
// deploy/grafana/cdc-outbox.json byte for byte, under the sidecar's label.
func TestDashboardIsTheFile(t *testing.T) {
	o := decode(t, "payments", values(t, valueSets["monitoring"]))
	cm := o.configMaps["payments-cdc-outbox-dashboard"]
	if cm == nil {
		t.Fatalf("no dashboard ConfigMap; rendered %v", o.kinds)
	}
	want, err := os.ReadFile(filepath.Join(repoRoot, "deploy/grafana/cdc-outbox.json"))
	if err != nil {
		t.Fatal(err)
	}
	if got := cm.Data["cdc-outbox.json"]; got != strings.TrimRight(string(want), "\n") {
		t.Errorf("the dashboard in the ConfigMap (%d bytes) is not deploy/grafana/cdc-outbox.json (%d bytes)", len(got), len(want))
	}
	if cm.Labels["grafana_dashboard"] != "1" || cm.Annotations["grafana_folder"] != "Outbox" {
		t.Errorf("labels %v, annotations %v: want the sidecar's label and the folder annotation", cm.Labels, cm.Annotations)
	}
}

// TestLinksToTheSources: the chart's files are links to the monitoring
// assets under deploy/, never copies.
func TestLinksToTheSources(t *testing.T) {
	for link, target := range map[string]string{
		"files/alerts.yml":      "deploy/prometheus/alerts.yml",
		"files/cdc-outbox.json": "deploy/grafana/cdc-outbox.json",
	} {
		p := filepath.Join(chartDir, link)
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("%s is a copy; it must be a link to %s", p, target)
			continue
		}
		abs, _ := filepath.Abs(p)
		resolved, err := filepath.EvalSymlinks(abs)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := filepath.Abs(filepath.Join(repoRoot, target))
		if resolved != want {
			t.Errorf("%s resolves to %s, want %s", p, resolved, want)
		}
	}
}

// TestEveryValueIsCommented: every top-level value has its comment right
// above it, where it is declared.
func TestEveryValueIsCommented(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	key := regexp.MustCompile(`^([A-Za-z][\w-]*):`)
	for i, l := range lines {
		m := key.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		if i == 0 || !strings.HasPrefix(lines[i-1], "#") {
			t.Errorf("values.yaml:%d: %s has no comment above it", i+1, m[1])
		}
	}
}
