package k8s

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// crdSchema is the v1beta1 schema of the agent-sandbox CRD in file (the module's k8s/crds, what
// `kubectl apply` installs), as the API server validates and prunes with it.
func crdSchema(t *testing.T, file string) (validation.SchemaValidator, *structuralschema.Structural) {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/agent-sandbox").Output()
	if err != nil {
		t.Fatalf("the agent-sandbox module's directory: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "k8s", "crds", file))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatal(err)
	}
	for _, v := range crd.Spec.Versions {
		if v.Name != "v1beta1" {
			continue
		}
		var internal apiextensions.JSONSchemaProps
		if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v.Schema.OpenAPIV3Schema, &internal, nil); err != nil {
			t.Fatal(err)
		}
		sv, _, err := validation.NewSchemaValidator(&internal)
		if err != nil {
			t.Fatal(err)
		}
		ss, err := structuralschema.NewStructural(&internal)
		if err != nil {
			t.Fatal(err)
		}
		return sv, ss
	}
	t.Fatalf("%s has no v1beta1", file)
	return nil, nil
}

// check validates obj against the CRD's schema and fails on any field the API server would prune.
func check(t *testing.T, file string, obj any) {
	t.Helper()
	sv, ss := crdSchema(t, file)
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var u map[string]any
	if err := json.Unmarshal(b, &u); err != nil {
		t.Fatal(err)
	}
	if errs := validation.ValidateCustomResource(field.NewPath(""), u, sv); len(errs) > 0 {
		t.Errorf("%s: %v\n%s", file, errs.ToAggregate(), b)
	}
	if pruned := pruning.PruneWithOptions(u, ss, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true}); len(pruned) > 0 {
		t.Errorf("%s: fields the API server would drop: %v", file, pruned)
	}
}

func workshop() Workshop {
	return Workshop{Name: "jq-tools", Image: "registry.example/shed:jq", Workdir: "/work",
		Allow: []Host{{Name: "deb.debian.org"}, {Name: "192.0.2.7", Port: 443}, {Name: "2001:db8::1"}}}
}

func TestManifestsValidate(t *testing.T) {
	objs, err := Manifests(workshop(), Options{Namespace: "agents", RuntimeClass: "gvisor", Replicas: 3, CPU: "2", Memory: "4Gi", EgressProxy: "10.0.0.9:3128"})
	if err != nil {
		t.Fatal(err)
	}
	check(t, "extensions.agents.x-k8s.io_sandboxtemplates.yaml", objs.Template)
	check(t, "extensions.agents.x-k8s.io_sandboxwarmpools.yaml", objs.WarmPool)
	spec := objs.Template.Spec
	pod := spec.PodTemplate.Spec
	if *pod.RuntimeClassName != "gvisor" || pod.Containers[0].Image != "registry.example/shed:jq" || pod.Containers[0].WorkingDir != "/work" {
		t.Errorf("pod: %+v", pod)
	}
	if got := pod.Containers[0].Resources.Limits.Memory().String(); got != "4Gi" {
		t.Errorf("memory limit %s", got)
	}
	// Two addresses and the proxy, nothing else; the pods' clients pointed at the proxy.
	var cidrs []string
	for _, r := range spec.NetworkPolicy.Egress {
		cidrs = append(cidrs, r.To[0].IPBlock.CIDR)
	}
	if strings.Join(cidrs, " ") != "192.0.2.7/32 2001:db8::1/128 10.0.0.9/32" {
		t.Errorf("egress: %v", cidrs)
	}
	if len(objs.Unreachable) != 0 {
		t.Errorf("unreachable with a proxy: %v", objs.Unreachable)
	}
	// The controller takes a template's policy whole: the sandbox router's ingress is in it.
	if in := spec.NetworkPolicy.Ingress; len(in) != 1 || in[0].From[0].PodSelector.MatchLabels["app"] != "sandbox-router" ||
		in[0].From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "agent-sandbox-system" {
		t.Errorf("ingress: %+v", in)
	}
	if *objs.WarmPool.Spec.Replicas != 3 || objs.WarmPool.Spec.TemplateRef.Name != "jq-tools" {
		t.Errorf("warm pool: %+v", objs.WarmPool.Spec)
	}
	y, err := objs.YAML()
	if err != nil || !strings.Contains(string(y), "kind: SandboxTemplate") || !strings.Contains(string(y), "\n---\n") {
		t.Errorf("yaml: %v\n%s", err, y)
	}
}

// Without a proxy a host name is unreachable, said so; the policy still validates and denies it.
func TestManifestsNoProxy(t *testing.T) {
	objs, err := Manifests(workshop(), Options{Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	check(t, "extensions.agents.x-k8s.io_sandboxtemplates.yaml", objs.Template)
	if len(objs.Unreachable) != 1 || objs.Unreachable[0] != "deb.debian.org" {
		t.Errorf("unreachable: %v", objs.Unreachable)
	}
	if len(objs.Template.Spec.NetworkPolicy.Egress) != 2 {
		t.Errorf("egress: %+v", objs.Template.Spec.NetworkPolicy.Egress)
	}
	// A Workshop with no network: a policy with no egress rule at all (deny), not the controller's
	// default (the public internet); the router still reaches it.
	w := workshop()
	w.Allow = nil
	objs, err = Manifests(w, Options{})
	if err != nil || objs.Template.Spec.NetworkPolicy == nil || len(objs.Template.Spec.NetworkPolicy.Egress) != 0 || len(objs.Template.Spec.NetworkPolicy.Ingress) != 1 {
		t.Errorf("no network: %v %+v", err, objs.Template.Spec.NetworkPolicy)
	}
	for _, o := range []Options{{CPU: "two"}, {EgressProxy: "proxy.local:3128"}} {
		if _, err := Manifests(workshop(), o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	if _, err := Manifests(Workshop{Name: "x"}, Options{}); err == nil {
		t.Error("no image: no error")
	}
}
