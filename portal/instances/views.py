from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from .sizes import SIZES


@login_required
def instance_list(request):
    return render(request, "instances/list.html", {"sizes": SIZES.values()})
