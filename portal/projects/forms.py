"""The project pages' forms. They check shapes and turn hours into seconds; the services judge."""

from decimal import Decimal

from django import forms

from portal.instances.sizes import SIZES

from .models import ProjectMembership

HOUR = 3600


class ProjectCreateForm(forms.Form):
    slug = forms.CharField(
        label="Short name", max_length=50, help_text="Lower-case letters, digits and dashes, e.g. vllm."
    )
    name = forms.CharField(max_length=100)
    repository_url = forms.URLField(label="Repository", required=False, assume_scheme="https")

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("auto_id", "id_create_%s")
        super().__init__(*args, **kwargs)


class InviteForm(forms.Form):
    email = forms.EmailField(label="Email address")
    role = forms.ChoiceField(choices=ProjectMembership.Role.choices, initial=ProjectMembership.Role.MEMBER)

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("auto_id", "id_invite_%s")
        super().__init__(*args, **kwargs)


class LimitsForm(forms.Form):
    max_live_instances = forms.IntegerField(label="Live instances at once", min_value=0)
    max_run_hours = forms.DecimalField(
        label="Longest run (hours)", min_value=Decimal("0.1"), decimal_places=2
    )
    allowed_sizes = forms.MultipleChoiceField(
        label="Sizes members may launch",
        choices=[(key, size.name) for key, size in SIZES.items()],
        widget=forms.CheckboxSelectMultiple,
        required=False,
    )
    member_monthly_cap_hours = forms.DecimalField(
        label="Monthly cap per member (GPU-hours)", min_value=0, decimal_places=2, help_text="0: no cap."
    )

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("auto_id", "id_limits_%s")
        super().__init__(*args, **kwargs)

    @classmethod
    def for_project(cls, project) -> "LimitsForm":
        return cls(
            initial={
                "max_live_instances": project.max_live_instances,
                "max_run_hours": Decimal(project.max_run_seconds) / HOUR,
                "allowed_sizes": project.allowed_sizes,
                "member_monthly_cap_hours": Decimal(project.member_monthly_cap_gpu_seconds) / HOUR,
            }
        )

    def limits(self) -> dict:
        """The cleaned limits as project_limits_update takes them (seconds)."""
        data = self.cleaned_data
        return {
            "max_live_instances": data["max_live_instances"],
            "max_run_seconds": int(data["max_run_hours"] * HOUR),
            "allowed_sizes": data["allowed_sizes"],
            "member_monthly_cap_gpu_seconds": int(data["member_monthly_cap_hours"] * HOUR),
        }


class CIGrantApplyForm(forms.Form):
    """An owner's application for the open-source CI programme (ci_grants.ci_grant_apply judges it)."""

    repository_url = forms.URLField(
        label="Repository",
        max_length=300,
        assume_scheme="https",
        help_text="Its https:// address, e.g. https://github.com/vllm-project/vllm.",
    )
    maintainers = forms.CharField(
        label="Maintainers",
        max_length=1000,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="GitHub logins or email addresses, e.g. alice-gh, bob@example.com.",
    )
    purpose = forms.CharField(
        label="What the GPUs are for",
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="e.g. the GPU tests of every pull request, nightly benchmarks.",
    )

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("auto_id", "id_ci_%s")
        super().__init__(*args, **kwargs)
