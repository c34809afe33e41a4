"""Importing the certificate IDs a program issued: matching applications are approved, now and later."""

import threading

import pytest
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection, transaction
from pytest_django.asserts import assertContains
from social_django.models import UserSocialAuth

from portal.credits import services
from portal.credits.models import (
    BonusApplication,
    BonusProgram,
    CertificateImport,
    CertificateRow,
    CreditAccount,
    IssuedCertificate,
    LedgerEntry,
    certificate_id_in_evidence,
)
from tests.conftest import mails_to

from ..conftest import make_user
from .conftest import shown_messages

HOUR = 3600
IMPORT_URL = "/admin/credits/certificateimport/add/"

# What a program might send: a byte-order mark, a header, a column that is ignored, the holders' email
# addresses in another case, stray spaces, a blank line, an ID in another case, and an ID twice.
ROCM_LIST = (
    "\ufeffcertificate_id,issued_on,Email\r\n"
    "ROCM-STAR-0042,2025-01-10,Alice@Example.com\r\n"
    "  rocm-star-0043 , 2025-01-11, bob@example.com\r\n"
    "\r\n"
    "ROCM-STAR-0044,2025-01-12,erin@example.com\r\n"
    "ROCM-STAR-0042,2025-01-10,alice@example.com\r\n"
).encode()
# The same IDs without holders.
BARE_LIST = b"certificate_id\nROCM-STAR-0042\nROCM-STAR-0043\nROCM-STAR-0044\n"


def alices_certificate(certificate_id="ROCM-STAR-0042"):
    return [CertificateRow(certificate_id, email="alice@example.com")]


@pytest.fixture
def dave(db):
    return make_user("dave@example.com", first_name="Dave")


def upload(client, program, content: bytes, name="rocm-star.csv", note="", trust_bare_ids=False):
    data = {"program": program.pk, "file": SimpleUploadedFile(name, content, content_type="text/csv"), "note": note}
    if trust_bare_ids:
        data["trust_bare_ids"] = "on"
    return client.post(IMPORT_URL, data, follow=True)


def bonus_of(user):
    account = CreditAccount.objects.filter(user=user).first()
    return account.bonus_gpu_seconds if account else 0


def test_it_imports_the_list_and_approves_the_pending_applications_that_name_a_listed_id(
    alice, bob, dave, olivia, olivia_client, rocm_star, mailoutbox, django_capture_on_commit_callbacks
):
    alices = services.bonus_apply(user=alice, program=rocm_star, evidence="rocm-star-0042")
    bobs = services.bonus_apply(
        user=bob, program=rocm_star, evidence="https://certs.example.com/verify/ROCM-STAR-0043"
    )
    daves = services.bonus_apply(user=dave, program=rocm_star, evidence="ROCM-STAR-9999")

    with django_capture_on_commit_callbacks(execute=True):
        response = upload(olivia_client, rocm_star, ROCM_LIST)

    batch = CertificateImport.objects.get()
    assert response.redirect_chain[-1][0] == f"/admin/credits/certificateimport/{batch.pk}/change/"
    assert (
        f"Imported rocm-star.csv for {rocm_star.name}: 4 rows read, 3 new IDs, 0 already listed, 1 repeated rows; "
        "2 pending application(s) approved." in shown_messages(response)
    )
    assert "The first row, \u201ccertificate_id\u201d, was read as a header and skipped." in shown_messages(
        response
    )
    assert sorted(IssuedCertificate.objects.values_list("certificate_id", flat=True)) == [
        "rocm-star-0042",
        "rocm-star-0043",
        "rocm-star-0044",
    ]
    for application, person in ((alices, alice), (bobs, bob)):
        application.refresh_from_db()
        assert (application.status, application.granted_gpu_seconds) == ("approved", 50 * HOUR)
        assert (application.decided_by, application.approved_via) == (olivia, batch)
        assert (
            application.decision_reason
            == f"Certificate ID and holder listed in import #{batch.pk} (rocm-star.csv) by Olivia Operator"
        )
        assert application.approval_basis == "holder"
        assert CreditAccount.objects.get(user=person).balance_gpu_seconds == 50 * HOUR
        [message] = mails_to(mailoutbox, person)
        assert "application was approved: 50.00 GPU-hours added" in message.subject
    daves.refresh_from_db()
    assert daves.status == "pending"
    assert not mails_to(mailoutbox, dave)
    # The summary page lists what the import approved.
    page = olivia_client.get(f"/admin/credits/certificateimport/{batch.pk}/change/")
    assertContains(page, "alice@example.com")
    assertContains(page, "https://certs.example.com/verify/ROCM-STAR-0043")


def test_it_approves_a_later_applicant_with_a_listed_id_at_once_and_emails_them(
    alice, olivia, rocm_star, mailoutbox, django_capture_on_commit_callbacks
):
    batch = services.certificates_import(
        program=rocm_star, rows=alices_certificate(), actor=olivia, filename="may.csv"
    )

    with django_capture_on_commit_callbacks(execute=True):
        application = services.bonus_apply(
            user=alice, program=rocm_star, evidence=" https://certs.example.com/v?id=Rocm-Star-0042"
        )

    assert (application.status, application.granted_gpu_seconds) == ("approved", 50 * HOUR)
    assert (application.decided_by, application.decided_by_name) == (None, "system (certificate list)")
    assert (
        application.decision_reason
        == f"Certificate ID and holder listed in import #{batch.pk} (may.csv) by Olivia Operator"
    )
    assert application.approved_via == batch
    assert CreditAccount.objects.get(user=alice).balance_gpu_seconds == 50 * HOUR
    [message] = mails_to(mailoutbox, alice)
    assert "approved" in message.subject


def test_it_leaves_an_applicant_whose_id_is_not_listed_pending(
    alice, olivia, rocm_star, mailoutbox, django_capture_on_commit_callbacks
):
    services.certificates_import(program=rocm_star, rows=alices_certificate(), actor=olivia)

    with django_capture_on_commit_callbacks(execute=True):
        application = services.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-00420")

    assert application.status == "pending"
    assert not LedgerEntry.objects.exists()
    assert not mailoutbox


def test_it_matches_ids_only_within_the_program_that_listed_them(alice, olivia, rocm_star, hackathon):
    services.certificates_import(program=hackathon, rows=alices_certificate(), actor=olivia)

    application = services.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-0042")

    assert application.status == "pending"


def test_it_adds_nothing_and_approves_nothing_twice_when_the_same_file_is_imported_again(
    alice, olivia_client, rocm_star, mailoutbox, django_capture_on_commit_callbacks
):
    services.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-0042")
    with django_capture_on_commit_callbacks(execute=True):
        upload(olivia_client, rocm_star, ROCM_LIST)

    with django_capture_on_commit_callbacks(execute=True):
        again = upload(olivia_client, rocm_star, ROCM_LIST)

    assert (
        f"Imported rocm-star.csv for {rocm_star.name}: 4 rows read, 0 new IDs, 3 already listed, 1 repeated rows; "
        "0 pending application(s) approved." in shown_messages(again)
    )
    assert IssuedCertificate.objects.count() == 3
    first, _ = CertificateImport.objects.order_by("pk")
    assert (
        IssuedCertificate.objects.filter(batch=first).count() == 3
    )  # IDs stay with the import that listed them
    assert LedgerEntry.objects.filter(account__user=alice).count() == 1
    assert CreditAccount.objects.get(user=alice).balance_gpu_seconds == 50 * HOUR
    assert len(mails_to(mailoutbox, alice)) == 1


def test_it_applies_the_bonus_cap_to_automatic_approvals(alice, olivia, olivia_client, rocm_star, hackathon):
    earlier = services.bonus_apply(user=alice, program=hackathon, evidence="HACK-1")
    services.bonus_approve(application_id=earlier.pk, actor=olivia)  # 30 of the 50 used
    application = services.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-0042")

    response = upload(olivia_client, rocm_star, ROCM_LIST)

    assert (
        f"Imported rocm-star.csv for {rocm_star.name}: 4 rows read, 3 new IDs, 0 already listed, 1 repeated rows; "
        "1 pending application(s) approved, 1 of them cut by the bonus cap." in shown_messages(response)
    )
    application.refresh_from_db()
    assert (application.requested_gpu_seconds, application.granted_gpu_seconds) == (50 * HOUR, 20 * HOUR)
    assert bonus_of(alice) == 50 * HOUR
    page = olivia_client.get(f"/admin/credits/certificateimport/{CertificateImport.objects.get().pk}/change/")
    assertContains(page, "cut by the 50 GPU-hour cap")


def test_it_applies_the_bonus_cap_to_an_applicant_approved_at_once(alice, olivia, rocm_star, hackathon):
    earlier = services.bonus_apply(user=alice, program=hackathon, evidence="HACK-1")
    services.bonus_approve(application_id=earlier.pk, actor=olivia)
    services.certificates_import(program=rocm_star, rows=alices_certificate(), actor=olivia)

    application = services.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-0042")

    assert (application.status, application.granted_gpu_seconds, application.clamped) == (
        "approved",
        20 * HOUR,
        True,
    )
    assert bonus_of(alice) == 50 * HOUR


def test_it_approves_only_one_application_per_listed_id(alice, bob, dave, olivia, olivia_client, rocm_star):
    alices = services.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-0042")
    bobs = services.bonus_apply(
        user=bob, program=rocm_star, evidence="https://certs.example.com/ROCM-STAR-0042"
    )

    response = upload(olivia_client, rocm_star, BARE_LIST, trust_bare_ids=True)
    daves = services.bonus_apply(user=dave, program=rocm_star, evidence="rocm-star-0042")

    assert (
        "1 pending application(s) name an ID that another application already used; they are left for you to review."
        in shown_messages(response)
    )
    alices.refresh_from_db()
    bobs.refresh_from_db()
    assert (alices.status, bobs.status, daves.status) == ("approved", "pending", "pending")
    assert IssuedCertificate.objects.get(certificate_id="rocm-star-0042").claimed_by == alices
    # The operator reviewing the copy is told why it was not approved.
    assertContains(
        olivia_client.get(f"/admin/credits/bonusapplication/{daves.pk}/change/"),
        "but the application of alice@example.com already used it",
    )


def test_it_does_not_reuse_an_id_an_operator_approved_by_hand_before_the_list_arrived(
    alice, bob, olivia, rocm_star
):
    alices = services.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-0042")
    services.bonus_approve(application_id=alices.pk, actor=olivia)

    services.certificates_import(program=rocm_star, rows=["ROCM-STAR-0042"], actor=olivia, trust_bare_ids=True)
    bobs = services.bonus_apply(user=bob, program=rocm_star, evidence="ROCM-STAR-0042")

    assert bobs.status == "pending"
    assert IssuedCertificate.objects.get().claimed_by == alices


def test_it_leaves_an_application_an_operator_rejected_alone(alice, olivia, rocm_star):
    application = services.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-0042")
    services.bonus_reject(application_id=application.pk, actor=olivia, reason="Certificate not found")

    batch = services.certificates_import(program=rocm_star, rows=alices_certificate(), actor=olivia)

    application.refresh_from_db()
    assert (application.status, batch.approved_count) == ("rejected", 0)


def _oversized():
    row = b"ROCM-STAR-000000000000000000000001\n"
    return row * (5 * 1024 * 1024 // len(row) + 1)


@pytest.mark.parametrize(
    "name, content, error",
    [
        ("ids.xlsx", b"PK\x03\x04rest-of-a-workbook", "ids.xlsx is not a CSV file."),
        (
            "ids.csv",
            b"PK\x03\x04rest-of-a-workbook",
            "This file is an Excel workbook or another zip file, not a CSV.",
        ),
        ("ids.csv", b"ROCM-STAR-1\x00\x01\x02", "This is not a CSV file: it contains binary data."),
        ("ids.csv", "ROCM-STAR-1\nZ\u00fcrich-7\n".encode("latin-1"), "The file is not UTF-8 text."),
        ("ids.csv", b"", "The file is empty: there are no certificate IDs in it."),
        ("ids.csv", b"\r\n  \r\n,,\r\n", "The file has no certificate IDs."),
        ("ids.csv", b"certificate_id\n", "Its only row, \u201ccertificate_id\u201d, was read as a header"),
        (
            "ids.csv",
            b"ROCM-STAR-1\n,Alice\nROCM-STAR-2\n" + b"X1" * 101 + b"\n",
            (
                "Nothing was imported: no certificate ID in the first column on line(s) 2; an ID longer than 200 "
                "characters on line(s) 4."
            ),
        ),
        ("ids.csv", _oversized(), "ids.csv is 5.0 MB; the limit is 5 MB."),
    ],
)
def test_it_refuses_a_file_it_cannot_use_and_imports_nothing(
    alice, olivia_client, rocm_star, name, content, error
):
    application = services.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-1")

    response = upload(olivia_client, rocm_star, content, name=name)

    assertContains(response, error)
    assertContains(response, "Nothing was imported.")
    assert not CertificateImport.objects.exists()
    assert not IssuedCertificate.objects.exists()
    application.refresh_from_db()
    assert application.status == "pending"


def test_it_reads_semicolon_and_tab_separated_files_and_files_without_a_header(
    olivia, olivia_client, rocm_star
):
    upload(olivia_client, rocm_star, b"ROCM-STAR-1;Alice\nROCM-STAR-2;Bob\n", name="a.csv")
    upload(olivia_client, rocm_star, b"ROCM-STAR-3\tCharlie\n", name="b.csv")

    assert sorted(IssuedCertificate.objects.values_list("certificate_id", flat=True)) == [
        "rocm-star-1",
        "rocm-star-2",
        "rocm-star-3",
    ]


@pytest.mark.parametrize(
    "evidence, certificate_id",
    [
        ("  ROCM-Star-0042 ", "rocm-star-0042"),
        ("https://certs.example.com/verify/ROCM-STAR-0042", "rocm-star-0042"),
        ("https://certs.example.com/verify/ROCM-STAR-0042/", "rocm-star-0042"),
        ("https://certs.example.com/verify?id=ROCM-STAR-0042&lang=en", "rocm-star-0042"),
        ("https://certs.example.com/verify?Certificate-ID=ROCM-STAR-0042&id=rocm-star-0042", "rocm-star-0042"),
        ("https://certs.example.com/c/ROCM%2DSTAR%2D42?utm_source=mail", "rocm-star-42"),
    ],
)
def test_it_finds_the_one_certificate_id_in_the_evidence(evidence, certificate_id):
    assert certificate_id_in_evidence(evidence) == certificate_id


@pytest.mark.parametrize(
    "evidence, error",
    [
        ("my id is ROCM-STAR-0042", "Enter one certificate ID"),
        ("ROCM-STAR-0042;ROCM-STAR-0043", "Enter one certificate ID"),
        ("https://certs.example.com/v?id=ROCM-STAR-1&cert=ROCM-STAR-2", "This link names several certificate IDs"),
        ("https://certs.example.com/c/ROCM%20STAR%2042", "This link names several certificate IDs"),
        ("https://certs.example.com/?lang=en", "This link does not show a certificate ID"),
        ("   ", "Enter your certificate ID"),
    ],
)
def test_it_refuses_evidence_that_does_not_name_exactly_one_id(evidence, error):
    with pytest.raises(ValidationError) as refused:
        certificate_id_in_evidence(evidence)

    assert error in refused.value.messages[0]


def test_it_keeps_non_staff_and_staff_without_the_permission_away_from_the_import(
    bob_client, oscar, rocm_star
):
    from django.test import Client

    oscar_client = Client()
    oscar_client.force_login(oscar)

    refused_bob = bob_client.post(
        IMPORT_URL, {"program": rocm_star.pk, "file": SimpleUploadedFile("a.csv", b"X-1\n")}
    )
    refused_oscar = oscar_client.post(
        IMPORT_URL, {"program": rocm_star.pk, "file": SimpleUploadedFile("a.csv", b"X-1\n")}
    )

    assert refused_bob.status_code == 302 and refused_bob["Location"].startswith("/admin/login/")
    assert bob_client.get(IMPORT_URL).status_code == 302
    assert refused_oscar.status_code == 403
    assert not IssuedCertificate.objects.exists()


def test_it_links_to_the_import_from_the_review_queue(olivia_client, rocm_star):
    assertContains(olivia_client.get("/admin/credits/bonusapplication/"), IMPORT_URL)
    assertContains(olivia_client.get("/admin/credits/bonusprogram/"), f"{IMPORT_URL}?program={rocm_star.pk}")


def test_it_imports_20k_ids_in_a_bounded_number_of_queries(
    alice, olivia, rocm_star, django_assert_max_num_queries
):
    services.bonus_apply(user=alice, program=rocm_star, evidence="CERT-00019999")
    ids = [f"CERT-{number:08d}" for number in range(20_000)]

    # Four INSERTs of 5,000 rows, a count, the lookups and the one approval: not one query per row.
    with django_assert_max_num_queries(40):
        batch = services.certificates_import(program=rocm_star, rows=ids, actor=olivia, trust_bare_ids=True)

    assert (batch.new_ids, batch.approved_count) == (20_000, 1)
    assert IssuedCertificate.objects.filter(program=rocm_star).count() == 20_000
    assert BonusApplication.objects.get(user=alice).status == "approved"


# --- Imports and applications racing (real PostgreSQL transactions on separate connections) ---------------


ERINS_CERTIFICATE = [CertificateRow("ROCM-STAR-7", email="erin@example.com")]


def _in_thread(work, results, name):
    def run():
        try:
            results[name] = work()
        except Exception as error:  # noqa: BLE001 -- handed to the test, which asserts on it
            results[name] = error
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
def test_it_approves_an_applicant_who_applies_while_an_import_is_running():
    operator = make_user("op@ops.example.com", staff=True, first_name="Op")
    applicant = make_user("erin@example.com")
    program = BonusProgram.objects.get(slug="rocm-star")
    imported, release, results = threading.Event(), threading.Event(), {}

    def import_and_hold():
        with transaction.atomic():
            services.certificates_import(program=program, rows=ERINS_CERTIFICATE, actor=operator)
            imported.set()
            release.wait(10)  # the import has run but not committed yet

    def apply_during_import():
        imported.wait(10)
        return services.bonus_apply(user=applicant, program=program, evidence="ROCM-STAR-7")

    importer = _in_thread(import_and_hold, results, "import")
    applying = _in_thread(apply_during_import, results, "apply")
    imported.wait(10)
    applying.join(timeout=1)
    # The application waits for the import instead of missing its uncommitted IDs.
    assert applying.is_alive()
    release.set()
    importer.join(timeout=20)
    applying.join(timeout=20)

    assert results["apply"].status == "approved", results
    assert CreditAccount.objects.get(user=applicant).bonus_gpu_seconds == 50 * HOUR


@pytest.mark.django_db(transaction=True)
def test_it_approves_an_application_filed_while_the_import_starts():
    operator = make_user("op@ops.example.com", staff=True, first_name="Op")
    applicant = make_user("erin@example.com")
    program = BonusProgram.objects.get(slug="rocm-star")
    applied, release, results = threading.Event(), threading.Event(), {}

    def apply_and_hold():
        with transaction.atomic():
            application = services.bonus_apply(user=applicant, program=program, evidence="ROCM-STAR-7")
            applied.set()
            release.wait(10)  # filed, not committed yet
        return application

    def import_during_apply():
        applied.wait(10)
        return services.certificates_import(program=program, rows=ERINS_CERTIFICATE, actor=operator)

    applying = _in_thread(apply_and_hold, results, "apply")
    importer = _in_thread(import_during_apply, results, "import")
    applied.wait(10)
    importer.join(timeout=1)
    # The import waits for the application instead of missing it.
    assert importer.is_alive()
    release.set()
    applying.join(timeout=20)
    importer.join(timeout=20)

    assert results["import"].approved_count == 1, results
    application = BonusApplication.objects.get(user=applicant)
    assert (application.status, application.decided_by) == ("approved", operator)


# --- Holders --------------------------------------------------------------------------------------------


def test_it_reads_the_holders_github_login_in_any_form_and_approves_that_github_user(
    bob, olivia_client, rocm_star
):
    UserSocialAuth.objects.create(user=bob, provider="github", uid="101", extra_data={"login": "Bob-Builds"})
    bobs = services.bonus_apply(user=bob, program=rocm_star, evidence="ROCM-STAR-0043")

    upload(
        olivia_client,
        rocm_star,
        b"Certificate ID;GitHub login\nROCM-STAR-0042;@alice-gh\nROCM-STAR-0043;https://github.com/bob-builds\n",
    )

    assert list(IssuedCertificate.objects.order_by("certificate_id").values_list("holder_github", flat=True)) == [
        "alice-gh",
        "bob-builds",
    ]
    bobs.refresh_from_db()
    assert (bobs.status, bobs.approval_basis) == ("approved", "holder")


def test_it_refuses_a_holder_column_value_that_cannot_be_a_holder_and_imports_nothing(olivia_client, rocm_star):
    response = upload(
        olivia_client,
        rocm_star,
        b"id,email,github\nROCM-1,alice.example.com,\nROCM-2,,not a login\nROCM-3,bob@example.com,bob\n",
    )

    assertContains(response, "an email column value that is not an address on line(s) 2")
    assertContains(response, "a GitHub column value that is not a GitHub login on line(s) 3")
    assert not IssuedCertificate.objects.exists()


def test_it_refuses_an_id_listed_twice_with_different_holders(olivia_client, rocm_star):
    response = upload(olivia_client, rocm_star, b"id,email\nROCM-1,alice@example.com\nrocm-1,bob@example.com\n")

    assertContains(response, "1 ID(s) are listed twice with different holders (e.g. rocm-1)")
    assert not CertificateImport.objects.exists()


def test_it_refuses_to_trust_bare_ids_in_a_list_that_names_holders(olivia_client, rocm_star):
    response = upload(olivia_client, rocm_star, ROCM_LIST, trust_bare_ids=True)

    assertContains(response, "approving on the ID alone is for lists without holders")
    assert not CertificateImport.objects.exists()


def test_an_operators_approval_of_someone_else_does_not_keep_the_listed_holder_waiting(
    alice, bob, olivia, rocm_star
):
    # The operator approved bob by hand, naming alice's ID, before the list said whose it is.
    bobs = services.bonus_apply(user=bob, program=rocm_star, evidence="ROCM-STAR-0042")
    services.bonus_approve(application_id=bobs.pk, actor=olivia)

    services.certificates_import(program=rocm_star, rows=alices_certificate(), actor=olivia)
    alices = services.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-0042")

    assert (alices.status, alices.approval_basis) == ("approved", "holder")
    assert IssuedCertificate.objects.get().claimed_by == alices


def test_the_review_page_says_when_the_applicant_is_not_the_listed_holder(bob, olivia, olivia_client, rocm_star):
    services.certificates_import(program=rocm_star, rows=alices_certificate(), actor=olivia)
    bobs = services.bonus_apply(user=bob, program=rocm_star, evidence="ROCM-STAR-0042")

    page = olivia_client.get(f"/admin/credits/bonusapplication/{bobs.pk}/change/")

    assert bobs.status == "pending"
    assertContains(page, "issued to alice@example.com: <strong>not this applicant</strong>", html=False)
