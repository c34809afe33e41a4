"""Project personas: alice owns vllm, bob is a member of it, dave owns another project (triton) and is in
no other. `fund` puts GPU-hours in a project's pool through its ledger."""

import uuid

import pytest

from portal.credits.models import CreditAccount, LedgerEntry
from portal.credits.services import ledger_post
from portal.projects import services
from portal.projects.models import ProjectMembership
from provisioning.drivers import fake
from tests.conftest import make_user

HOUR = 3600


def fund(project, gpu_hours) -> LedgerEntry:
    """Credit `gpu_hours` to the project's pool, as an operator's grant would."""
    return ledger_post(
        account=CreditAccount.objects.get(project=project),
        kind=LedgerEntry.Kind.GRANT,
        gpu_seconds=int(gpu_hours * HOUR),
        idempotency_key=f"test-fund:{uuid.uuid4()}",
        reason="Test grant to the project",
    )


def pool_balance(project) -> int:
    return CreditAccount.objects.get(project=project).balance_gpu_seconds


def add_member(project, user, role=ProjectMembership.Role.MEMBER) -> ProjectMembership:
    return ProjectMembership.objects.create(project=project, user=user, role=role)


@pytest.fixture(autouse=True)
def launch_needs_15_credit_minutes(settings):
    settings.LAUNCH_MIN_CREDIT_MINUTES = 15


@pytest.fixture
def cpu(db):
    return fake.make_image("cpu", sizes=["1x", "8x"])


@pytest.fixture
def dave(db):
    return make_user("dave@example.com", first_name="Dave")


@pytest.fixture
def vllm(alice, bob):
    """alice owns it, bob is a member; an empty pool."""
    project = services.project_create(
        user=alice, slug="vllm", name="vLLM", repository_url="https://github.com/vllm-project/vllm"
    )
    add_member(project, bob)
    return project


@pytest.fixture
def triton(dave):
    return services.project_create(user=dave, slug="triton", name="Triton")
