"""Forms for the credit pages and the operator console. Hours are entered, GPU-seconds are stored."""

import csv
import io
import re
import uuid
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator

from .models import (
    CERTIFICATE_ID_MAX_LENGTH,
    GPU_SECONDS_PER_HOUR,
    BonusProgram,
    CertificateRow,
    SignupGrantProgram,
    certificate_id_in_evidence,
    normalise_github_login,
)

EVIDENCE_MAX_LENGTH = 500
# Generous ceiling for one operator entry; a typo of a few extra digits should be refused, not posted.
MAX_HOURS_PER_ENTRY = Decimal("100000")

# Something with a scheme ("ftp://", "javascript:") or starting like a web address is treated as a
# link and must be http(s); anything else (e.g. "ROCM-STAR-2024-0042") is a certificate ID.
_LOOKS_LIKE_URL = re.compile(
    r"^([a-z][a-z0-9+.\-]*://|(javascript|data|file|vbscript|mailto):|www\.)", re.IGNORECASE
)


def hours_to_gpu_seconds(hours: Decimal) -> int:
    """Whole GPU-seconds for a number of GPU-hours, rounded half up (0.01 h = 36 s, so no loss)."""
    return int((hours * GPU_SECONDS_PER_HOUR).to_integral_value(rounding=ROUND_HALF_UP))


def gpu_seconds_to_hours(gpu_seconds: int) -> Decimal:
    return (Decimal(gpu_seconds) / GPU_SECONDS_PER_HOUR).quantize(Decimal("0.01"))


class HoursField(forms.DecimalField):
    """GPU-hours with at most two decimals; `cleaned_data` holds the Decimal, `to_gpu_seconds` converts."""

    def __init__(self, **kwargs):
        kwargs.setdefault("max_digits", 9)
        kwargs.setdefault("decimal_places", 2)
        kwargs.setdefault("max_value", MAX_HOURS_PER_ENTRY)
        super().__init__(**kwargs)
        self.error_messages = {
            **self.error_messages,
            "invalid": "Enter the hours as a number, for example 5 or 2.5.",
            "required": "Enter a number of GPU-hours.",
            "max_decimal_places": "Use at most two decimals (0.01 GPU-hour is 36 GPU-seconds).",
        }


def validate_evidence(value: str) -> None:
    """Refuse links that are not http(s): the operator opens them from the console."""
    if not _LOOKS_LIKE_URL.match(value):
        return
    if not value.lower().startswith(("http://", "https://")):
        raise ValidationError("A link must start with https:// or http://.", code="scheme")
    try:
        URLValidator(schemes=["http", "https"])(value)
    except ValidationError:
        raise ValidationError("That link is not a valid web address.", code="invalid_url") from None


class BonusApplyForm(forms.Form):
    program = forms.ModelChoiceField(
        queryset=BonusProgram.objects.none(),
        empty_label=None,
        error_messages={"invalid_choice": "That program is not taking applications right now."},
    )
    evidence = forms.CharField(
        label="Certificate ID or URL",
        max_length=EVIDENCE_MAX_LENGTH,
        validators=[validate_evidence],
        error_messages={
            "required": "Enter your certificate ID or the link to your certificate.",
            "max_length": "Keep it to %(limit_value)d characters or fewer (it has %(show_value)d).",
        },
        widget=forms.TextInput(
            attrs={"placeholder": "e.g. ROCM-STAR-2024-0042 or https://…", "autocomplete": "off"}
        ),
    )

    def __init__(self, *args, programs, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["program"].queryset = programs

    def clean_evidence(self):
        evidence = self.cleaned_data["evidence"]
        # One application is one guess: evidence naming several IDs is refused, not tried ID by ID.
        certificate_id_in_evidence(evidence)
        return evidence


class CreditAdjustForm(forms.Form):
    """An operator's grant or correction. The hidden key makes a double-submitted form post once."""

    hours = HoursField(
        label="GPU-hours",
        min_value=-MAX_HOURS_PER_ENTRY,
        help_text="Positive adds credit, negative corrects it downwards (e.g. -2.5).",
    )
    reason = forms.CharField(
        max_length=500,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Recorded in the ledger and shown to the developer.",
        error_messages={"required": "Give a reason; it is recorded in the ledger."},
    )
    idempotency_key = forms.UUIDField(
        widget=forms.HiddenInput,
        error_messages={
            "required": "This form has expired. Reload the page and submit it again.",
            "invalid": "This form has expired. Reload the page and submit it again.",
        },
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.is_bound:
            # A fresh key per rendered form: the same page submitted twice carries the same key.
            self.initial.setdefault("idempotency_key", uuid.uuid4())

    def clean_hours(self):
        hours = self.cleaned_data["hours"]
        if hours_to_gpu_seconds(hours) == 0:
            raise ValidationError("An adjustment of zero hours changes nothing.", code="zero")
        return hours

    def clean(self):
        cleaned = super().clean()
        # The key is invisible, so its error belongs at the top of the form where it is seen.
        if "idempotency_key" in self.errors:
            for error in self.errors.pop("idempotency_key"):
                self.add_error(None, error)
        return cleaned


class BonusApproveForm(forms.Form):
    hours = HoursField(
        label="GPU-hours to grant",
        help_text="Up to the program maximum. The per-person bonus cap may grant fewer; you will be told.",
    )
    note = forms.CharField(
        required=False,
        max_length=500,
        label="Note (optional)",
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Shown to the applicant.",
    )

    def __init__(self, *args, program: BonusProgram, **kwargs):
        super().__init__(*args, **kwargs)
        self.program = program
        self.fields["hours"].initial = gpu_seconds_to_hours(program.max_gpu_seconds)

    def clean_hours(self):
        hours = self.cleaned_data["hours"]
        gpu_seconds = hours_to_gpu_seconds(hours)
        if gpu_seconds <= 0:
            raise ValidationError(
                "Grant more than zero hours, or reject the application instead.", code="min"
            )
        if gpu_seconds > self.program.max_gpu_seconds:
            raise ValidationError(
                f"{self.program.name} grants at most {self.program.max_hours} GPU-hours.", code="max"
            )
        return hours


class BonusRejectForm(forms.Form):
    reason = forms.CharField(
        max_length=1000,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Shown to the applicant, so say what they can do about it.",
        error_messages={"required": "Give the applicant a reason for the rejection."},
    )


class _HoursModelForm(forms.ModelForm):
    """A program form whose GPU-seconds field is edited as hours, with the why for the audit log."""

    seconds_field: str
    hours = HoursField(label="GPU-hours", min_value=Decimal("0.01"))
    change_reason = forms.CharField(
        label="Reason for this change",
        max_length=500,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Recorded in the audit log with your name.",
        error_messages={"required": "Say why; the reason is recorded in the audit log."},
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.initial["hours"] = gpu_seconds_to_hours(getattr(self.instance, self.seconds_field))

    def _post_clean(self):
        # Before the model validates itself, so its CheckConstraint sees the new value.
        if "hours" in self.cleaned_data:
            setattr(self.instance, self.seconds_field, hours_to_gpu_seconds(self.cleaned_data["hours"]))
        super()._post_clean()


class SignupGrantProgramForm(_HoursModelForm):
    seconds_field = "gpu_seconds"
    hours = HoursField(label="GPU-hours per account", min_value=Decimal("0.01"))

    class Meta:
        model = SignupGrantProgram
        fields = ["name", "max_accounts", "open_until", "is_active"]


class BonusProgramForm(_HoursModelForm):
    seconds_field = "max_gpu_seconds"
    hours = HoursField(label="Maximum GPU-hours", min_value=Decimal("0.01"))

    class Meta:
        model = BonusProgram
        fields = ["name", "slug", "description", "evidence_label", "is_active"]


# --- Certificate lists --------------------------------------------------------------------------------

CERTIFICATE_FILE_MAX_BYTES = 5 * 1024 * 1024
CERTIFICATE_FILE_EXTENSIONS = (".csv", ".txt")
# How many offending row numbers an error message lists before "and N more".
ROWS_NAMED_IN_ERRORS = 5
# What a workbook or a PDF starts with: named in the error, because they are the usual wrong uploads.
_NOT_CSV_SIGNATURES = {
    b"PK\x03\x04": "an Excel workbook or another zip file",
    b"\xd0\xcf\x11\xe0": "an old Excel workbook",
    b"%PDF": "a PDF",
}


# Header names of the holder columns, compared lower-case with spaces and hyphens as underscores.
EMAIL_COLUMNS = frozenset({"email", "e_mail", "email_address", "holder_email", "mail"})
GITHUB_COLUMNS = frozenset(
    {"github", "github_login", "github_username", "github_user", "github_handle", "holder_github"}
)
_GITHUB_LOGIN = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,38})$")


@dataclass(frozen=True)
class CertificateList:
    """What a certificate CSV held: one CertificateRow per data row (stripped, in file order, repeats
    kept), with the holder's email and GitHub login when the header names those columns, and the header
    row's first cell when the file had one."""

    filename: str
    rows: list[CertificateRow]
    header: str | None

    @property
    def ids(self) -> list[str]:
        return [row.certificate_id for row in self.rows]

    @property
    def has_holders(self) -> bool:
        return any(row.has_holder for row in self.rows)


def _column_name(cell: str) -> str:
    return re.sub(r"[\s\-]+", "_", cell.strip().lower())


def _holder_columns(header_cells: list[str]) -> tuple[int | None, int | None]:
    """Indexes of the email and GitHub columns a header row names (None when it names none)."""
    names = [_column_name(cell) for cell in header_cells]
    email = next((index for index, name in enumerate(names) if name in EMAIL_COLUMNS), None)
    github = next((index for index, name in enumerate(names) if name in GITHUB_COLUMNS), None)
    return email, github


def _rows_named(rows: list[int]) -> str:
    named = ", ".join(str(row) for row in rows[:ROWS_NAMED_IN_ERRORS])
    more = len(rows) - ROWS_NAMED_IN_ERRORS
    return f"{named} and {more} more" if more > 0 else named


def parse_certificate_csv(data: bytes, *, filename: str = "") -> CertificateList:
    """Read a CSV of certificate IDs: one ID per row in the first column. When the header row names an
    email column ("email") or a GitHub column ("github", "github_login"), those cells are the holder of
    the row's certificate; any other column (issue date, name) is ignored. Tolerates a UTF-8 byte-order
    mark, surrounding whitespace, blank lines, repeated IDs and comma, semicolon or tab separators. The
    first row is a header, and skipped, when its first cell has no digit: certificate IDs have digits,
    headers such as "certificate_id" do not.

    Returns a CertificateList. Raises ValidationError saying what is wrong when the data is not UTF-8
    CSV text, holds no ID, or has rows without an ID, with an ID that is too long, or with a holder's
    email or GitHub login that cannot be one; the caller imports nothing then.
    """
    for signature, what in _NOT_CSV_SIGNATURES.items():
        if data.startswith(signature):
            raise ValidationError(
                f"This file is {what}, not a CSV. Save it as CSV (one ID per row) and upload that."
            )
    if b"\x00" in data:
        raise ValidationError(
            "This is not a CSV file: it contains binary data. Upload a text file with one ID per row."
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValidationError(
            "The file is not UTF-8 text. Save it as \u201cCSV UTF-8\u201d and upload it again."
        ) from None
    first_line = next((line for line in text.splitlines() if line.strip()), "")
    delimiter = next((candidate for candidate in (",", ";", "\t") if candidate in first_line), ",")
    rows, header, without_id, too_long, bad_email, bad_github = [], None, [], [], [], []
    email_column = github_column = None
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        for row in reader:
            cells = [cell.strip() for cell in row]
            if not any(cells):
                continue
            value = cells[0]
            if (
                not rows
                and header is None
                and not without_id
                and not too_long
                and value
                and not any(c.isdigit() for c in value)
            ):
                header = value
                email_column, github_column = _holder_columns(cells)
                continue
            email = cells[email_column] if email_column is not None and email_column < len(cells) else ""
            github = cells[github_column] if github_column is not None and github_column < len(cells) else ""
            if not value:
                without_id.append(reader.line_num)
            elif len(value) > CERTIFICATE_ID_MAX_LENGTH:
                too_long.append(reader.line_num)
            elif email and (email.count("@") != 1 or len(email) > 254 or email.startswith("@")):
                bad_email.append(reader.line_num)
            elif github and not _GITHUB_LOGIN.match(normalise_github_login(github)):
                bad_github.append(reader.line_num)
            else:
                rows.append(CertificateRow(value, email=email, github=github))
    except csv.Error as error:
        raise ValidationError(
            f"This file is not a CSV we can read (line {reader.line_num}: {error})."
        ) from None
    problems = []
    if without_id:
        problems.append(f"no certificate ID in the first column on line(s) {_rows_named(without_id)}")
    if too_long:
        problems.append(
            f"an ID longer than {CERTIFICATE_ID_MAX_LENGTH} characters on line(s) {_rows_named(too_long)}"
        )
    if bad_email:
        problems.append(f"an email column value that is not an address on line(s) {_rows_named(bad_email)}")
    if bad_github:
        problems.append(
            f"a GitHub column value that is not a GitHub login on line(s) {_rows_named(bad_github)}"
        )
    if problems:
        raise ValidationError(
            f"Nothing was imported: {'; '.join(problems)}. Fix the file and upload it again."
        )
    if not rows:
        only_header = (
            f" Its only row, \u201c{header}\u201d, was read as a header because it has no digit."
            if header
            else ""
        )
        raise ValidationError(
            f"The file has no certificate IDs. Put one ID per row in the first column.{only_header}"
        )
    return CertificateList(filename=filename, rows=rows, header=header)


class CertificateImportForm(forms.Form):
    """An operator's upload of the certificate IDs a program issued."""

    program = forms.ModelChoiceField(
        queryset=BonusProgram.objects.all(),
        empty_label=None,
        help_text="Pending applications to this program from the listed holder of the ID they name are "
        "approved at once, and so are later ones.",
    )
    file = forms.FileField(
        label="CSV file",
        help_text="One certificate ID per row in the first column. Name the holder in an \u201cemail\u201d "
        "or \u201cgithub\u201d column (header row needed); further columns (issue date, name) are "
        "ignored. At most 5 MB.",
        error_messages={
            "required": "Choose the CSV file to import.",
            "empty": "The file is empty: there are no certificate IDs in it.",
        },
    )
    trust_bare_ids = forms.BooleanField(
        required=False,
        label="Approve on the ID alone",
        help_text="Only for a list without holders. Anyone who knows or guesses a listed ID then gets the "
        "hours, so these approvals do not open the bonus launch sizes (8x MI300X). Unticked, applications "
        "naming the IDs wait for your review.",
    )
    note = forms.CharField(
        required=False,
        max_length=500,
        label="Note (optional)",
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Recorded in the audit log, e.g. who sent the list.",
    )

    def clean_file(self) -> CertificateList:
        uploaded = self.cleaned_data["file"]
        name = uploaded.name or ""
        if not name.lower().endswith(CERTIFICATE_FILE_EXTENSIONS):
            raise ValidationError(
                f"{name} is not a CSV file. Upload a .csv file with one certificate ID per row."
            )
        if uploaded.size > CERTIFICATE_FILE_MAX_BYTES:
            raise ValidationError(
                f"{name} is {uploaded.size / 1024 / 1024:.1f} MB; the limit is 5 MB. Split it into smaller files."
            )
        return parse_certificate_csv(uploaded.read(), filename=name)
