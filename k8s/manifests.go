// Package k8s renders a Workshop as the Kubernetes objects of SIG Apps' agent-sandbox
// (sigs.k8s.io/agent-sandbox, v1beta1): a SandboxTemplate of the Workshop's image and a
// SandboxWarmPool of it (issue 29). The objects are the project's own Go types, so what is
// rendered is what its controller reads.
package k8s

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/yaml"

	"toolshed.dev/shed/internal/hint"
)

// Host is a destination the Workshop's network profile allows (its allow entries, and with the
// debian profile its mirror's and sources' hosts).
type Host struct {
	Name string // a DNS name or an IP literal
	Port int    // 0: any
}

// Workshop is what the objects are made of.
type Workshop struct {
	Name    string // the Workshop's name: the objects' too, unless Options.Name
	Image   string // the image a pod runs (REPO:TAG or REPO@DIGEST), from `shed copy --image`
	Env     []corev1.EnvVar
	Workdir string
	Allow   []Host
}

// Options are what a cluster adds to the Workshop.
type Options struct {
	Name         string // the objects' name (default: the Workshop's)
	Namespace    string // "" leaves it to kubectl's
	RuntimeClass string // the pods' runtimeClassName ("" for the cluster's default)
	Replicas     int32  // the warm pool's size
	CPU, Memory  string // each pod's requests and limits (Kubernetes quantities; "" for none)
	// EgressProxy is an allowlisting HTTP proxy (IP:PORT) the pods reach for the host names their
	// profile allows, which a NetworkPolicy cannot name; "" leaves those hosts unreachable.
	EgressProxy string
}

// Objects are a Workshop's agent-sandbox objects.
type Objects struct {
	Template *extv1beta1.SandboxTemplate
	WarmPool *extv1beta1.SandboxWarmPool
	// Unreachable are the allowed host names the policy cannot let through (no EgressProxy).
	Unreachable []string
}

// Labels every object carries.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelWorkshop  = "toolshed.dev/workshop"
)

// Manifests makes the objects of w.
func Manifests(w Workshop, o Options) (*Objects, error) {
	name := o.Name
	if name == "" {
		name = w.Name
	}
	if w.Image == "" {
		return nil, hint.Wrap(errors.New("a SandboxTemplate needs the Workshop's image (--image)"), "`shed copy --to oci://HOST/REPO --image TAG WORKSHOP` pushes it and prints its name")
	}
	res, err := resources(o.CPU, o.Memory)
	if err != nil {
		return nil, err
	}
	policy, env, unreachable, err := network(w.Allow, o.EgressProxy)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{LabelManagedBy: "shed", LabelWorkshop: w.Name}
	container := corev1.Container{
		Name:  "workshop",
		Image: w.Image,
		// The image's own command is a shell; a sandbox's pod stays up for the agent's commands.
		Command:    []string{"sleep", "infinity"},
		Env:        append(append([]corev1.EnvVar{}, w.Env...), env...),
		WorkingDir: w.Workdir,
		Resources:  res,
	}
	podSpec := corev1.PodSpec{Containers: []corev1.Container{container}}
	if o.RuntimeClass != "" {
		rc := o.RuntimeClass
		podSpec.RuntimeClassName = &rc
	}
	tmpl := &extv1beta1.SandboxTemplate{
		TypeMeta:   metav1.TypeMeta{APIVersion: extv1beta1.GroupVersion.String(), Kind: extv1beta1.SandboxTemplateKind},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: o.Namespace, Labels: labels},
		Spec: extv1beta1.SandboxTemplateSpec{
			SandboxBlueprint: sandboxv1beta1.SandboxBlueprint{
				PodTemplate: sandboxv1beta1.PodTemplate{
					ObjectMeta: sandboxv1beta1.PodMetadata{Labels: labels},
					Spec:       podSpec,
				},
			},
			NetworkPolicy:           policy,
			NetworkPolicyManagement: extv1beta1.NetworkPolicyManagementManaged,
			// The Workshop's environment is its recipe's: a claim adds none.
			EnvVarsInjectionPolicy: extv1beta1.EnvVarsInjectionPolicyDisallowed,
		},
	}
	replicas := o.Replicas
	pool := &extv1beta1.SandboxWarmPool{
		TypeMeta:   metav1.TypeMeta{APIVersion: extv1beta1.GroupVersion.String(), Kind: extv1beta1.SandboxWarmPoolKind},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: o.Namespace, Labels: labels},
		Spec: extv1beta1.SandboxWarmPoolSpec{
			Replicas:    &replicas,
			TemplateRef: extv1beta1.SandboxTemplateRef{Name: name},
		},
	}
	return &Objects{Template: tmpl, WarmPool: pool, Unreachable: unreachable}, nil
}

func resources(cpu, memory string) (corev1.ResourceRequirements, error) {
	list := corev1.ResourceList{}
	for n, v := range map[corev1.ResourceName]string{corev1.ResourceCPU: cpu, corev1.ResourceMemory: memory} {
		if v == "" {
			continue
		}
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return corev1.ResourceRequirements{}, hint.Wrap(fmt.Errorf("%s %q: %w", n, v, err), "write a Kubernetes quantity: e.g. 2 or 500m for cpu, 4Gi for memory")
		}
		list[n] = q
	}
	if len(list) == 0 {
		return corev1.ResourceRequirements{}, nil
	}
	// Requests equal to limits: a warm pod holds what it will use, as a Bench's limits do.
	return corev1.ResourceRequirements{Requests: list, Limits: list.DeepCopy()}, nil
}

// routerIngress lets agent-sandbox's sandbox router reach the pods: the rule of its controller's
// default policy, which a template that gives a policy of its own replaces whole (ingress too).
func routerIngress() networkingv1.NetworkPolicyIngressRule {
	return networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "agent-sandbox-system"}},
		PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "sandbox-router"}},
	}}}
}

// network is the template's policy. Ingress: the sandbox router only. Egress: an IP literal the
// profile allows is an ipBlock of one address (with its port); a host name cannot be named by a
// NetworkPolicy, so with an egress proxy the policy lets the pods reach only the proxy and its env
// points the usual clients at it, and without one the name is unreachable (reported). No rule for
// DNS: a pod resolves nothing itself when it reaches only addresses and a proxy, which resolves
// names for it.
func network(allow []Host, egressProxy string) (*extv1beta1.NetworkPolicySpec, []corev1.EnvVar, []string, error) {
	policy := &extv1beta1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{routerIngress()}}
	var env []corev1.EnvVar
	var names []string
	for _, h := range allow {
		a, err := netip.ParseAddr(h.Name)
		if err != nil {
			names = append(names, hostPort(h))
			continue
		}
		policy.Egress = append(policy.Egress, egressTo(a, h.Port))
	}
	if len(names) == 0 {
		return policy, nil, nil, nil
	}
	if egressProxy == "" {
		return policy, nil, names, nil
	}
	ap, err := netip.ParseAddrPort(egressProxy)
	if err != nil {
		return nil, nil, nil, hint.Wrap(fmt.Errorf("--egress-proxy %q: %v", egressProxy, err), "write IP:PORT: a NetworkPolicy names addresses, not hosts")
	}
	policy.Egress = append(policy.Egress, egressTo(ap.Addr(), int(ap.Port())))
	u := "http://" + ap.String()
	for _, k := range []string{"http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"} {
		env = append(env, corev1.EnvVar{Name: k, Value: u})
	}
	return policy, env, nil, nil
}

func egressTo(a netip.Addr, port int) networkingv1.NetworkPolicyEgressRule {
	bits := 32
	if a.Is6() {
		bits = 128
	}
	rule := networkingv1.NetworkPolicyEgressRule{
		To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: netip.PrefixFrom(a, bits).String()}}},
	}
	if port != 0 {
		tcp := corev1.ProtocolTCP
		p := intstr.FromInt32(int32(port))
		rule.Ports = []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p}}
	}
	return rule
}

func hostPort(h Host) string {
	if h.Port == 0 {
		return h.Name
	}
	return h.Name + ":" + strconv.Itoa(h.Port)
}

// YAML is the objects as two YAML documents, the template first (the pool refers to it).
func (o *Objects) YAML() ([]byte, error) {
	var b bytes.Buffer
	for i, obj := range []any{o.Template, o.WarmPool} {
		y, err := yaml.Marshal(obj)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			b.WriteString("---\n")
		}
		b.Write(y)
	}
	return b.Bytes(), nil
}
