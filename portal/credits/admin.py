"""Operator console for credits: accounts and adjustments, the read-only ledger, bonus review (one at a
time, in bulk, or by importing a program's list of certificate IDs), and programs.

Nothing here writes credits directly: every change goes through services, which record the operator on
the entry or decision and write the audit log in the same transaction; the console also writes Django's
admin LogEntry for each action.
"""

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, Q
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from portal.accounts.models import User

from . import selectors, services
from .forms import (
    BonusApproveForm,
    BonusProgramForm,
    BonusRejectForm,
    CertificateImportForm,
    CreditAdjustForm,
    SignupGrantProgramForm,
    hours_to_gpu_seconds,
)
from .models import (
    BonusApplication,
    BonusProgram,
    CertificateImport,
    CreditAccount,
    IssuedCertificate,
    LedgerEntry,
    SignupGrantProgram,
    hours,
)

# How many entries a change page shows before linking to the full ledger.
LEDGER_PREVIEW_ROWS = 50


def signed_hours(gpu_seconds: int) -> str:
    return f"+{hours(gpu_seconds)}" if gpu_seconds > 0 else hours(gpu_seconds)


def ledger_table(user) -> str:
    """The user's latest ledger entries as a read-only HTML table, with a link to all of them."""
    entries = list(selectors.ledger_for(user, limit=LEDGER_PREVIEW_ROWS))
    if not entries:
        return "No entries yet."
    rows = format_html_join(
        "",
        '<tr><td>{}</td><td>{}</td><td>{}</td><td class="num">{}</td><td class="num">{}</td><td>{}</td></tr>',
        (
            (
                entry.created_at.strftime("%Y-%m-%d %H:%M"),
                entry.get_kind_display(),
                entry.reason,
                signed_hours(entry.gpu_seconds),
                entry.balance_after_hours,
                entry.actor_name or "system",
            )
            for entry in entries
        ),
    )
    full_ledger = (
        reverse("admin:credits_ledgerentry_changelist") + f"?account__id__exact={entries[0].account_id}"
    )
    return format_html(
        '<table data-testid="ledger"><thead><tr><th>Date</th><th>Kind</th><th>Reason</th><th>GPU-hours</th>'
        "<th>Balance after</th><th>By</th></tr></thead><tbody>{}</tbody></table>"
        '<p><a href="{}">All ledger entries</a></p>',
        rows,
        full_ledger,
    )


def adjust_url(user) -> str:
    return reverse("admin:credits_creditaccount_adjust", args=[user.pk])


@admin.register(CreditAccount)
class CreditAccountAdmin(admin.ModelAdmin):
    """Balances are read-only here: they change only through ledger entries (the adjust view)."""

    list_display = ("user", "project", "balance", "bonus", "updated_at")
    list_select_related = ("user", "project")
    search_fields = ("user__email", "project__slug")
    ordering = ("user__email", "project__slug")
    fields = ("user", "project", "balance", "bonus", "updated_at", "adjust_link", "recent_entries")
    readonly_fields = fields

    @admin.display(description="Balance (GPU-hours)", ordering="balance_gpu_seconds")
    def balance(self, account):
        return account.balance_hours

    @admin.display(description="Bonus collected (GPU-hours)", ordering="bonus_gpu_seconds")
    def bonus(self, account):
        return hours(account.bonus_gpu_seconds)

    @admin.display(description="Adjust")
    def adjust_link(self, account):
        if account.user_id is None:
            return "A project's pool: granted through the operators' programme for projects."
        return format_html(
            '<a class="button" href="{}">Grant or correct credits</a>', adjust_url(account.user)
        )

    @admin.display(description="Ledger")
    def recent_entries(self, account):
        if account.user_id is None:
            return "Its owners see its usage on the project's page."
        return ledger_table(account.user)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_urls(self):
        # Before the default URLs, whose "<path:object_id>/" would swallow "adjust/<id>/".
        return [
            path(
                "adjust/<int:user_id>/",
                self.admin_site.admin_view(self.adjust_view),
                name="credits_creditaccount_adjust",
            )
        ] + super().get_urls()

    def adjust_view(self, request, user_id):
        """Grant (positive) or correct (negative) a user's credits, with a reason, via credits_adjust."""
        if not request.user.has_perm("console.adjust_credits"):
            raise PermissionDenied
        target = get_object_or_404(User, pk=user_id)
        if request.method == "POST":
            form = CreditAdjustForm(request.POST)
            if form.is_valid():
                gpu_seconds = hours_to_gpu_seconds(form.cleaned_data["hours"])
                reason = form.cleaned_data["reason"]
                # The key is scoped to the user, so a key copied onto another user's form cannot
                # return (and report) someone else's entry.
                key = f"adjust:{target.pk}:{form.cleaned_data['idempotency_key']}"
                already_posted = LedgerEntry.objects.filter(idempotency_key=key).exists()
                try:
                    entry = services.credits_adjust(
                        user=target,
                        gpu_seconds=gpu_seconds,
                        reason=reason,
                        actor=request.user,
                        idempotency_key=key,
                    )
                except ValidationError as error:
                    form.add_error(None, error)
                else:
                    if already_posted:
                        messages.warning(
                            request,
                            f"This adjustment was already posted (the form was submitted twice); nothing more "
                            f"changed. Balance of {target.email}: {hours(selectors.balance_for(target))} GPU-hours.",
                        )
                    else:
                        self.log_change(
                            request, target, f"Credits {signed_hours(entry.gpu_seconds)} GPU-hours: {reason}"
                        )
                        messages.success(
                            request,
                            f"{signed_hours(entry.gpu_seconds)} GPU-hours for {target.email}. "
                            f"New balance: {entry.balance_after_hours} GPU-hours.",
                        )
                    return redirect("admin:accounts_user_change", target.pk)
        else:
            form = CreditAdjustForm()
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Grant or correct credits: {target.email}",
            "form": form,
            "target": target,
            "balance_hours": hours(selectors.balance_for(target)),
            "user_url": reverse("admin:accounts_user_change", args=[target.pk]),
        }
        return TemplateResponse(request, "admin/credits/adjust_credits.html", context)


@admin.register(LedgerEntry)
class LedgerEntryAdmin(admin.ModelAdmin):
    """The ledger is append-only (the database refuses changes), so the console only reads it."""

    list_display = (
        "created_at",
        "user_email",
        "kind",
        "gpu_hours",
        "balance_after_display",
        "reason",
        "actor_name",
    )
    list_filter = ("kind",)
    search_fields = ("account__user__email", "account__project__slug")
    list_select_related = ("account__user", "account__project")
    date_hierarchy = "created_at"
    fields = (
        "user_email",
        "kind",
        "gpu_hours",
        "balance_after_display",
        "reason",
        "actor_name",
        "idempotency_key",
        "created_at",
    )
    readonly_fields = fields

    @admin.display(description="User", ordering="account__user__email")
    def user_email(self, entry):
        if entry.account.user_id is None:
            return f"project {entry.account.project.slug} (its pool)"
        return entry.account.user.email

    @admin.display(description="GPU-hours", ordering="gpu_seconds")
    def gpu_hours(self, entry):
        return signed_hours(entry.gpu_seconds)

    @admin.display(description="Balance after (GPU-hours)")
    def balance_after_display(self, entry):
        return entry.balance_after_hours

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def same_id_table(applications) -> str:
    """Applications (from selectors.applications_naming_same_id) as links with applicant, program and
    status, for an operator judging whether a certificate ID is shared or guessed."""
    if not applications:
        return "None: no other application named this ID."
    return format_html_join(
        "<br>",
        '<a href="{}">{}</a> \u2013 {}, {}{}, applied {}',
        (
            (
                reverse("admin:credits_bonusapplication_change", args=[other.pk]),
                other.user.email,
                other.program.name,
                other.get_status_display(),
                f" ({other.get_approval_basis_display()})" if other.approval_basis else "",
                other.created_at.strftime("%Y-%m-%d %H:%M"),
            )
            for other in applications
        ),
    )


@admin.register(BonusApplication)
class BonusApplicationAdmin(admin.ModelAdmin):
    """Pending applications open as a review page (approve or reject); decided ones are read-only."""

    list_display = (
        "applicant",
        "program",
        "status",
        "evidence_link",
        "created_at",
        "granted",
        "decided_by_name",
    )
    list_filter = ("status", "approval_basis", "program")
    search_fields = ("user__email", "evidence", "certificate_id")
    list_select_related = ("user", "program")
    actions = ["approve_full", "reject_selected"]
    fields = (
        "user",
        "program",
        "evidence_link",
        "certificate_id",
        "same_id_table",
        "status",
        "created_at",
        "decided_at",
        "decided_by_name",
        "approval_basis",
        "decision_reason",
        "requested",
        "granted",
        "approved_via",
    )
    readonly_fields = fields

    @admin.display(description="Applications naming the same ID")
    def same_id_table(self, application):
        return same_id_table(selectors.applications_naming_same_id(application))

    @admin.display(description="Applicant", ordering="user__email")
    def applicant(self, application):
        return application.user.email

    @admin.display(description="Evidence")
    def evidence_link(self, application):
        # Only http(s) is ever a link: evidence is user input and the operator clicks it.
        if application.evidence.lower().startswith(("http://", "https://")):
            return format_html(
                '<a href="{}" rel="noopener noreferrer" target="_blank">{}</a>',
                application.evidence,
                application.evidence,
            )
        return application.evidence

    @admin.display(description="Requested (GPU-hours)")
    def requested(self, application):
        if application.requested_gpu_seconds is None:
            return "–"
        return hours(application.requested_gpu_seconds)

    @admin.display(description="Granted (GPU-hours)", ordering="granted_gpu_seconds")
    def granted(self, application):
        if application.status != BonusApplication.Status.APPROVED:
            return "–"
        return application.granted_hours

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        # A decision is final: decided applications are shown read-only.
        if obj is not None and obj.status != BonusApplication.Status.PENDING:
            return False
        # Changing an application means deciding it, which is the operator's review permission.
        return request.user.has_perm("console.review_bonus")

    def change_view(self, request, object_id, form_url="", extra_context=None):
        application = self.get_object(request, unquote(object_id))
        if (
            application is not None
            and application.status == BonusApplication.Status.PENDING
            and self.has_change_permission(request, application)
        ):
            return self.review_view(request, application)
        if (
            application is not None
            and request.method == "POST"
            and ("_approve" in request.POST or "_reject" in request.POST)
        ):
            # A second click, or another operator was faster: say who decided instead of a bare 403.
            messages.error(
                request,
                f"This application was already {application.get_status_display().lower()} by "
                f"{application.decided_by_name}; nothing changed.",
            )
            return redirect("admin:credits_bonusapplication_change", application.pk)
        return super().change_view(request, object_id, form_url, extra_context)

    def review_view(self, request, application):
        approve_form = BonusApproveForm(prefix="approve", program=application.program)
        reject_form = BonusRejectForm(prefix="reject")
        if request.method == "POST" and "_approve" in request.POST:
            approve_form = BonusApproveForm(request.POST, prefix="approve", program=application.program)
            if approve_form.is_valid():
                return self._decide(
                    request,
                    application,
                    approve_gpu_seconds=hours_to_gpu_seconds(approve_form.cleaned_data["hours"]),
                    reason=approve_form.cleaned_data["note"],
                )
        elif request.method == "POST" and "_reject" in request.POST:
            reject_form = BonusRejectForm(request.POST, prefix="reject")
            if reject_form.is_valid():
                return self._decide(request, application, reason=reject_form.cleaned_data["reason"])

        account = selectors.account_of(application.user)
        bonus_so_far = account.bonus_gpu_seconds if account else 0
        listed = (
            IssuedCertificate.objects.filter(
                program=application.program_id, certificate_id=application.certificate_id
            )
            .exclude(certificate_id="")
            .select_related("batch", "claimed_by__user")
            .first()
        )
        room = max(services.bonus_cap_gpu_seconds() - bonus_so_far, 0)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Review application from {application.user.email}",
            "application": application,
            "original": application,
            "evidence": self.evidence_link(application),
            "approve_form": approve_form,
            "reject_form": reject_form,
            "bonus_so_far_hours": hours(bonus_so_far),
            "room_hours": hours(room),
            "cap_hours": settings.BONUS_CAP_GPU_HOURS,
            "other_applications": BonusApplication.objects.filter(user=application.user)
            .exclude(pk=application.pk)
            .select_related("program"),
            "same_id": same_id_table(selectors.applications_naming_same_id(application)),
            "user_url": reverse("admin:accounts_user_change", args=[application.user_id]),
            # Pending although its ID is listed means another application used that ID first, or the
            # applicant is not the listed holder, or the list was not trusted without holders.
            "listed_certificate": listed,
            "is_holder": listed is not None
            and listed.has_holder
            and services.is_listed_holder(certificate=listed, user=application.user),
        }
        return TemplateResponse(request, "admin/credits/bonusapplication/review.html", context)

    def _decide(self, request, application, *, reason, approve_gpu_seconds=None):
        """Approve (when approve_gpu_seconds is given) or reject, report the outcome, go back to the list."""
        try:
            if approve_gpu_seconds is not None:
                decided = services.bonus_approve(
                    application_id=application.pk,
                    actor=request.user,
                    gpu_seconds=approve_gpu_seconds,
                    reason=reason,
                )
            else:
                decided = services.bonus_reject(
                    application_id=application.pk, actor=request.user, reason=reason
                )
        except ValidationError as error:
            # Typically another operator decided it first; the page now shows their decision.
            messages.error(request, " ".join(error.messages))
            return redirect("admin:credits_bonusapplication_change", application.pk)
        self._report(request, decided)
        return redirect("admin:credits_bonusapplication_changelist")

    def _report(self, request, application):
        """Log the decision and tell the operator what happened, including a clamp by the bonus cap."""
        who = application.user.email
        if application.status == BonusApplication.Status.REJECTED:
            self.log_change(request, application, f"Rejected: {application.decision_reason}")
            messages.success(request, f"Rejected the {application.program.name} application from {who}.")
            return
        requested, granted = hours(application.requested_gpu_seconds), application.granted_hours
        self.log_change(request, application, f"Approved: requested {requested}, granted {granted} GPU-hours")
        if application.clamped:
            messages.warning(
                request,
                f"{who}: requested {requested} GPU-hours, granted {granted} because of the "
                f"{settings.BONUS_CAP_GPU_HOURS} GPU-hour per-person bonus cap.",
            )
        else:
            messages.success(
                request, f"Approved {granted} GPU-hours of {application.program.name} for {who}."
            )

    def changelist_view(self, request, extra_context=None):
        extra_context = {
            **(extra_context or {}),
            "can_import_certificates": CertificateImportAdmin.may_import(request),
        }
        return super().changelist_view(request, extra_context)

    @admin.action(description="Approve selected (full hours)", permissions=["change"])
    def approve_full(self, request, queryset):
        result = services.bonus_approve_many(
            application_ids=queryset.values_list("pk", flat=True), actor=request.user
        )
        for decided in result.decided:
            self._report(request, decided)
        if result.skipped:
            messages.warning(request, f"Skipped {result.skipped} application(s) that were already decided.")

    @admin.action(description="Reject selected (one reason for all)", permissions=["change"])
    def reject_selected(self, request, queryset):
        """First a page listing the selection and asking for the reason; its form posts back here."""
        form = BonusRejectForm(request.POST if "_confirm_reject" in request.POST else None, prefix="bulk")
        if form.is_valid():
            result = services.bonus_reject_many(
                application_ids=queryset.values_list("pk", flat=True),
                actor=request.user,
                reason=form.cleaned_data["reason"],
            )
            for decided in result.decided:
                self.log_change(request, decided, f"Rejected: {decided.decision_reason}")
            if result.decided:
                messages.success(
                    request,
                    f"Rejected {len(result.decided)} application(s); each applicant is emailed the reason.",
                )
            if result.skipped:
                messages.warning(
                    request, f"Skipped {result.skipped} application(s) that were already decided."
                )
            return None  # back to the list
        selected = list(queryset.select_related("user", "program").order_by("created_at", "pk"))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Reject the selected applications",
            "form": form,
            "pending": [
                application
                for application in selected
                if application.status == BonusApplication.Status.PENDING
            ],
            "decided": [
                application
                for application in selected
                if application.status != BonusApplication.Status.PENDING
            ],
            "selected": selected,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/credits/bonusapplication/reject_selected.html", context)


@admin.register(CertificateImport)
class CertificateImportAdmin(admin.ModelAdmin):
    """Imports of a program's certificate IDs. "Add" is the upload page; an import is never edited."""

    list_display = (
        "__str__",
        "program",
        "imported_by_name",
        "imported_at",
        "rows_read",
        "new_ids",
        "already_listed",
        "duplicate_rows",
        "approved_count",
        "clamped_count",
        "left_pending_count",
        "needs_review_count",
    )
    list_filter = ("program",)
    list_select_related = ("program",)
    date_hierarchy = "imported_at"
    fields = (
        "program",
        "filename",
        "imported_by_name",
        "imported_at",
        "rows_read",
        "duplicate_rows",
        "new_ids",
        "already_listed",
        "with_holders",
        "trust_bare_ids",
        "approved_count",
        "clamped_count",
        "left_pending_count",
        "needs_review_count",
        "approved_table",
    )
    readonly_fields = fields

    @staticmethod
    def may_import(request) -> bool:
        # An import approves applications, so it takes the permission that approving takes.
        return request.user.has_perm("console.review_bonus")

    def has_add_permission(self, request):
        return self.may_import(request)

    def has_view_permission(self, request, obj=None):
        return self.may_import(request) or super().has_view_permission(request, obj)

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="Applications approved through this list")
    def approved_table(self, batch):
        applications = list(batch.approved_applications.select_related("user").order_by("decided_at", "pk"))
        if not applications:
            return "None."
        rows = format_html_join(
            "",
            '<tr><td><a href="{}">{}</a></td><td>{}</td><td class="num">{}</td><td class="num">{}</td><td>{}</td></tr>',
            (
                (
                    reverse("admin:credits_bonusapplication_change", args=[application.pk]),
                    application.user.email,
                    application.evidence,
                    hours(application.requested_gpu_seconds or 0),
                    application.granted_hours,
                    f"cut by the {settings.BONUS_CAP_GPU_HOURS} GPU-hour cap" if application.clamped else "",
                )
                for application in applications
            ),
        )
        return format_html(
            '<table data-testid="approved"><thead><tr><th>Applicant</th><th>Evidence</th><th>Requested</th>'
            "<th>Granted</th><th></th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    def add_view(self, request, form_url="", extra_context=None):
        """The upload page: pick the program and the CSV; the import runs in the request."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            form = CertificateImportForm(request.POST, request.FILES)
            if form.is_valid():
                certificate_list = form.cleaned_data["file"]
                try:
                    batch = services.certificates_import(
                        program=form.cleaned_data["program"],
                        rows=certificate_list.rows,
                        actor=request.user,
                        filename=certificate_list.filename,
                        note=form.cleaned_data["note"],
                        trust_bare_ids=form.cleaned_data["trust_bare_ids"],
                    )
                except ValidationError as error:
                    form.add_error("file", error)
                else:
                    self.log_addition(request, batch, f"Imported {batch.rows_read} rows")
                    self._report(request, batch, certificate_list.header)
                    return redirect("admin:credits_certificateimport_change", batch.pk)
        else:
            form = CertificateImportForm(initial={"program": request.GET.get("program")})
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Import certificate IDs",
            "form": form,
        }
        return TemplateResponse(request, "admin/credits/certificateimport/upload.html", context)

    def _report(self, request, batch, header):
        messages.success(
            request,
            f"Imported {batch.filename} for {batch.program.name}: {batch.rows_read} rows read, "
            f"{batch.new_ids} new IDs, {batch.already_listed} already listed, {batch.duplicate_rows} repeated "
            f"rows; {batch.approved_count} pending application(s) approved"
            + (f", {batch.clamped_count} of them cut by the bonus cap." if batch.clamped_count else "."),
        )
        if header:
            messages.info(request, f"The first row, \u201c{header}\u201d, was read as a header and skipped.")
        if batch.trust_bare_ids:
            messages.warning(
                request,
                "You chose to approve on the ID alone: whoever names a listed ID gets the hours. These "
                "approvals do not open the bonus launch sizes (8x MI300X).",
            )
        elif not batch.with_holders:
            messages.warning(
                request,
                "This list has no holders (no email or GitHub column), so its IDs approve nothing by "
                "themselves: applications naming them wait for your review.",
            )
        if batch.needs_review_count:
            messages.warning(
                request,
                f"{batch.needs_review_count} pending application(s) name a listed ID but are not from its "
                "holder (or the ID has no holder); they are left for you to review.",
            )
        if batch.left_pending_count:
            messages.warning(
                request,
                f"{batch.left_pending_count} pending application(s) name an ID that another application already "
                "used; they are left for you to review.",
            )


class _ProgramAdmin(admin.ModelAdmin):
    """Programs are switched off, not deleted: grants and applications point at them. Every save says why
    and is recorded in the audit log (services.program_save)."""

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        services.program_save(program=obj, actor=request.user, reason=form.cleaned_data["change_reason"])


@admin.register(SignupGrantProgram)
class SignupGrantProgramAdmin(_ProgramAdmin):
    form = SignupGrantProgramForm
    list_display = ("name", "grant_hours", "max_accounts", "granted_count", "open_until", "is_active")
    list_filter = ("is_active",)
    fields = ("name", "hours", "max_accounts", "open_until", "is_active", "granted_count", "change_reason")
    readonly_fields = ("granted_count",)

    @admin.display(description="GPU-hours per account", ordering="gpu_seconds")
    def grant_hours(self, program):
        return hours(program.gpu_seconds)


@admin.register(BonusProgram)
class BonusProgramAdmin(_ProgramAdmin):
    form = BonusProgramForm
    list_display = ("name", "slug", "maximum_hours", "pending", "is_active", "certificate_list")
    list_filter = ("is_active",)
    search_fields = ("name", "slug")
    fields = ("name", "slug", "description", "evidence_label", "hours", "is_active", "change_reason")
    prepopulated_fields = {"slug": ("name",)}

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(pending_count=Count("applications", filter=Q(applications__status="pending")))
        )

    @admin.display(description="Maximum GPU-hours", ordering="max_gpu_seconds")
    def maximum_hours(self, program):
        return program.max_hours

    @admin.display(description="Pending applications", ordering="pending_count")
    def pending(self, program):
        if not program.pending_count:
            return 0
        url = (
            reverse("admin:credits_bonusapplication_changelist")
            + f"?program__id__exact={program.pk}&status__exact=pending"
        )
        return format_html('<a href="{}">{}</a>', url, program.pending_count)

    @admin.display(description="Certificate list")
    def certificate_list(self, program):
        url = reverse("admin:credits_certificateimport_add") + f"?program={program.pk}"
        return format_html('<a href="{}">Import IDs</a>', url)
