#pragma once

#include "model/keyrecord.h"

#include <QColor>
#include <QIcon>

class QApplication;

namespace idem {

// Colours for states and outcomes, readable on the current palette: darker tones on a light
// window, lighter ones on a dark window (docs/dashboard.md#desktop).
bool paletteIsDark();
QColor stateColour(KeyState state);
QColor outcomeColour(Outcome outcome);
// The JSON highlighter's colours (key, string, number, literal), readable on the palette.
enum class JsonPart { Key, String, Number, Literal };
QColor jsonColour(JsonPart part);
// The background of a stuck processing key, and of the delivery that won the claim.
QColor stuckBackground();
QColor winnerBackground();

// Whether the desktop asks for dark: GTK_THEME names a dark theme (Adwaita:dark, Adwaita-dark,
// Yaru-dark), or GNOME's color-scheme says prefer-dark or its gtk-theme is a dark one.
bool desktopWantsDark();
// Follows the desktop's colour scheme at start: a dark Fusion palette when the desktop asks
// for dark and the platform palette is not dark already. Qt 6.4 has no colour-scheme API.
void followDesktopColourScheme(QApplication &app);
// Fusion with a dark palette (what followDesktopColourScheme() applies when dark is wanted).
void useDarkPalette(QApplication &app);

// The application icon, every size of resources/icons (window and taskbar).
QIcon applicationIcon();

} // namespace idem
