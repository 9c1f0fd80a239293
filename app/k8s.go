//go:build !shed_lean

package app

import (
	"context"

	corev1 "k8s.io/api/core/v1"

	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/k8s"
)

func init() {
	op("k8s.manifests", (*Service).K8sManifests)
}

// K8sManifestsRequest asks for a Workshop's agent-sandbox objects (docs/kubernetes.md).
type K8sManifestsRequest struct {
	Workshop     string `json:"workshop,omitempty"` // a record or a recipe file (default ./workshop.toml)
	Image        string `json:"image"`              // the Workshop's image, as `copy --image` pushed it
	Name         string `json:"name,omitempty"`     // the objects' name (default: the Workshop's)
	Namespace    string `json:"namespace,omitempty"`
	RuntimeClass string `json:"runtime_class,omitempty"`
	Replicas     int32  `json:"replicas"`
	CPU          string `json:"cpu,omitempty"`
	Memory       string `json:"memory,omitempty"`
	EgressProxy  string `json:"egress_proxy,omitempty"` // IP:PORT of an allowlisting proxy for host names
}

// K8sManifestsResult is the objects as YAML, and what their network policy cannot let through.
type K8sManifestsResult struct {
	YAML        string   `json:"yaml"`
	Unreachable []string `json:"unreachable,omitempty"` // allowed host names no NetworkPolicy can name
}

// K8sManifests renders a Workshop's SandboxTemplate and SandboxWarmPool.
func (s *Service) K8sManifests(ctx context.Context, c *Call, req *K8sManifestsRequest) (*K8sManifestsResult, error) {
	workshop := req.Workshop
	if workshop == "" {
		workshop = DefaultRecipe
	}
	r, err := s.loadRecipe(c, workshop)
	if err != nil {
		return nil, err
	}
	rules, err := bench.Rules(r)
	if err != nil {
		return nil, err
	}
	w := k8s.Workshop{Name: r.Name, Image: req.Image, Workdir: r.Workdir}
	for _, e := range r.Env {
		w.Env = append(w.Env, corev1.EnvVar{Name: e.Name, Value: e.Value})
	}
	for _, rule := range rules {
		w.Allow = append(w.Allow, k8s.Host{Name: rule.Host, Port: rule.Port})
	}
	if req.Replicas < 0 {
		return nil, usage("write 0 or more", "--replicas %d: a warm pool's size is not negative", req.Replicas)
	}
	objs, err := k8s.Manifests(w, k8s.Options{Name: req.Name, Namespace: req.Namespace, RuntimeClass: req.RuntimeClass,
		Replicas: req.Replicas, CPU: req.CPU, Memory: req.Memory, EgressProxy: req.EgressProxy})
	if err != nil {
		return nil, fail(CodeUsage, err, "")
	}
	y, err := objs.YAML()
	if err != nil {
		return nil, err
	}
	return &K8sManifestsResult{YAML: string(y), Unreachable: objs.Unreachable}, nil
}
