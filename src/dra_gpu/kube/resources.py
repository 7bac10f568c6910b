"""The API resources the driver touches, with the facts needed to build their URLs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resource:
    kind: str
    group: str
    version: str
    plural: str
    namespaced: bool
    has_status: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            prefix += f"/namespaces/{namespace}"
        path = f"{prefix}/{self.plural}"
        if name:
            path += f"/{name}"
            if subresource:
                path += f"/{subresource}"
        return path


RESOURCES: dict[str, Resource] = {
    r.kind: r
    for r in (
        Resource("ResourceSlice", "resource.k8s.io", "v1", "resourceslices", False),
        Resource("ResourceClaim", "resource.k8s.io", "v1", "resourceclaims", True, has_status=True),
        Resource("ResourceClaimTemplate", "resource.k8s.io", "v1", "resourceclaimtemplates", True),
        Resource("DeviceClass", "resource.k8s.io", "v1", "deviceclasses", False),
        Resource("DeviceTaintRule", "resource.k8s.io", "v1", "devicetaintrules", False),
        Resource("Node", "", "v1", "nodes", False, has_status=True),
        Resource("Pod", "", "v1", "pods", True, has_status=True),
        Resource("Event", "", "v1", "events", True),
        Resource("Lease", "coordination.k8s.io", "v1", "leases", True),
        # Reviews are created and answered, never stored: who may read the HTTP endpoint's /metrics.
        Resource("TokenReview", "authentication.k8s.io", "v1", "tokenreviews", False),
        Resource("SubjectAccessReview", "authorization.k8s.io", "v1", "subjectaccessreviews", False),
        Resource("ClusterRole", "rbac.authorization.k8s.io", "v1", "clusterroles", False),
        Resource("ClusterRoleBinding", "rbac.authorization.k8s.io", "v1", "clusterrolebindings", False),
    )
}
