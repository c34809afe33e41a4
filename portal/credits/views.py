from django.contrib.auth.decorators import login_required
from django.shortcuts import render


@login_required
def dashboard(request):
    return render(request, "credits/dashboard.html")


@login_required
def bonus(request):
    return render(request, "credits/bonus.html")
